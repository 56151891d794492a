// StopMatcher implementation; semantics in stop.h.
#include "runtime/stop.h"

#include <algorithm>
#include <utility>

namespace g4 {
namespace {

// Length of a trailing UTF-8 sequence that has a lead byte but not all its continuation bytes
// (0 if the text ends on a complete character or on bytes that can never start a character).
size_t IncompleteUtf8Tail(std::string_view s) {
  const size_t n = s.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const auto b = static_cast<unsigned char>(s[n - back]);
    if ((b & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
    size_t need;
    if ((b & 0xE0) == 0xC0) {
      need = 2;
    } else if ((b & 0xF0) == 0xE0) {
      need = 3;
    } else if ((b & 0xF8) == 0xF0) {
      need = 4;
    } else {
      return 0;  // ASCII or an invalid lead: nothing to wait for
    }
    return need > back ? back : 0;
  }
  return 0;
}

}  // namespace

StatusOr<StopMatcher> StopMatcher::Create(std::vector<std::string> stops) {
  for (size_t i = 0; i < stops.size(); ++i) {
    if (stops[i].empty()) return InvalidArgument("stop[" + std::to_string(i) + "] is empty");
  }
  return StopMatcher(std::move(stops));
}

StopMatcher::StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {}

StopMatcher::Result StopMatcher::Feed(std::string_view piece) {
  Result r;
  if (stopped()) {
    r.stopped = true;
    r.stop_index = stop_index_;
    return r;
  }
  held_.append(piece);

  // Earliest completed stop: smallest end offset, then smallest start (the longest).
  size_t best_start = std::string::npos, best_end = std::string::npos;
  int best = -1;
  for (size_t i = 0; i < stops_.size(); ++i) {
    const size_t pos = held_.find(stops_[i]);
    if (pos == std::string::npos) continue;
    const size_t end = pos + stops_[i].size();
    if (best < 0 || end < best_end || (end == best_end && pos < best_start)) {
      best = static_cast<int>(i);
      best_start = pos;
      best_end = end;
    }
  }
  if (best >= 0) {
    stop_index_ = best;
    r.text = held_.substr(0, best_start);
    r.stopped = true;
    r.stop_index = best;
    held_.clear();
    return r;
  }

  // No match yet: hold the longest tail that is a proper prefix of a stop string (a future match
  // can only start there, or it would have been found above), and any incomplete UTF-8 tail.
  size_t hold = IncompleteUtf8Tail(held_);
  for (const std::string& s : stops_) {
    for (size_t len = std::min(s.size() - 1, held_.size()); len > hold; --len) {
      if (held_.compare(held_.size() - len, len, s, 0, len) == 0) {
        hold = len;
        break;
      }
    }
  }
  r.text = held_.substr(0, held_.size() - hold);
  held_.erase(0, held_.size() - hold);
  return r;
}

StopMatcher::Result StopMatcher::Flush() {
  Result r;
  r.stopped = stopped();
  r.stop_index = stop_index_;
  r.text = std::move(held_);
  held_.clear();
  return r;
}

}  // namespace g4
