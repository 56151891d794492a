#include "base/status.h"

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

}  // namespace g4
