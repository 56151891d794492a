#include "base/status.h"

#include <cerrno>
#include <exception>
#include <new>
#include <system_error>

namespace g4 {

std::string Status::ToString() const {
  const char* name = "OK";
  switch (code_) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kInvalidArgument: name = "INVALID_ARGUMENT"; break;
    case StatusCode::kNotFound: name = "NOT_FOUND"; break;
    case StatusCode::kDataLoss: name = "DATA_LOSS"; break;
    case StatusCode::kFailedPrecondition: name = "FAILED_PRECONDITION"; break;
    case StatusCode::kUnimplemented: name = "UNIMPLEMENTED"; break;
    case StatusCode::kResourceExhausted: name = "RESOURCE_EXHAUSTED"; break;
    case StatusCode::kInternal: name = "INTERNAL"; break;
    case StatusCode::kCancelled: name = "CANCELLED"; break;
  }
  return std::string(name) + ": " + message_;
}

Status StatusFromCurrentException(const std::string& doing, const std::string& memory_hint) {
  const std::string hint = memory_hint.empty() ? "" : " (" + memory_hint + ")";
  try {
    throw;
  } catch (const std::bad_alloc&) {
    return ResourceExhausted("out of memory while " + doing + hint);
  } catch (const std::system_error& e) {
    if (e.code() == std::errc::not_enough_memory || e.code() == std::errc::resource_unavailable_try_again)
      return ResourceExhausted("out of memory or threads while " + doing + " (" + e.what() + ")" + hint);
    return Internal(doing + ": " + e.what());
  } catch (const std::exception& e) {
    return Internal(doing + ": " + e.what());
  } catch (...) {
    return Internal(doing + ": an unknown exception");
  }
}

}  // namespace g4
