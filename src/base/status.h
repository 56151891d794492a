// Status and StatusOr: how every boundary of the engine reports failure.
//
// Bad input (files, configs, requests, flags) yields a Status with a message that names the
// offending file/field; it never aborts. Broken internal invariants use G4_CHECK (check.h).
#pragma once

#include <cassert>
#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace g4 {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,   // the caller passed something malformed (flag, request, token id)
  kNotFound,          // a file or tensor that should exist does not
  kDataLoss,          // a file exists but is truncated or corrupt
  kFailedPrecondition,// e.g. a sequence that is not allocated, a context that is full
  kUnimplemented,     // a valid input we do not support yet (named in the message)
  kResourceExhausted, // KV cache or memory budget exceeded
  kInternal,
  kCancelled,         // the caller asked to stop (an interrupt flag), before the work was done
};

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "CODE: message", for logs and CLI errors.
  std::string ToString() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status OkStatus() { return Status(); }
inline Status InvalidArgument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
inline Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status DataLoss(std::string m) { return {StatusCode::kDataLoss, std::move(m)}; }
inline Status FailedPrecondition(std::string m) { return {StatusCode::kFailedPrecondition, std::move(m)}; }
inline Status Unimplemented(std::string m) { return {StatusCode::kUnimplemented, std::move(m)}; }
inline Status ResourceExhausted(std::string m) { return {StatusCode::kResourceExhausted, std::move(m)}; }
inline Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
inline Status Cancelled(std::string m) { return {StatusCode::kCancelled, std::move(m)}; }

// The Status for an exception caught where it must not end the process (main, the server's loader
// and scheduler; ThreadPool's workers rethrow to the caller). `doing`: what was under way ("loading
// the model"). std::bad_alloc and std::system_error with ENOMEM or EAGAIN (a thread that could not
// start) are RESOURCE_EXHAUSTED, "out of memory while DOING (HINT)" (`memory_hint`: what needs the
// memory; none if empty); any other exception INTERNAL, "DOING: " + its what(). Call it inside a
// catch block (it rethrows std::current_exception()).
Status StatusFromCurrentException(const std::string& doing, const std::string& memory_hint = "");

// Holds either a value or a non-OK Status.
template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(Status s) : v_(std::move(s)) { assert(!std::get<Status>(v_).ok()); }
  StatusOr(T value) : v_(std::move(value)) {}

  bool ok() const { return std::holds_alternative<T>(v_); }
  // The error, or a shared OK status; a reference, so `status().message()` is safe to bind.
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<Status, T> v_;
};

}  // namespace g4

#define G4_CONCAT_INNER(a, b) a##b
#define G4_CONCAT(a, b) G4_CONCAT_INNER(a, b)

// Returns from the enclosing function if `expr` (a Status) is not OK.
#define G4_RETURN_IF_ERROR(expr)              \
  do {                                        \
    ::g4::Status g4_status_ = (expr);         \
    if (!g4_status_.ok()) return g4_status_;  \
  } while (0)

// `G4_ASSIGN_OR_RETURN(auto x, F())`: assigns the value of a StatusOr or returns its Status.
#define G4_ASSIGN_OR_RETURN(lhs, expr) \
  G4_ASSIGN_OR_RETURN_IMPL(G4_CONCAT(g4_statusor_, __LINE__), lhs, expr)
#define G4_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                             \
  if (!tmp.ok()) return tmp.status();            \
  lhs = std::move(tmp).value()
