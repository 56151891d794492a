// A decode step's launches recorded once as a CUDA graph and replayed while nothing they capture
// changes (the key: the KV cache, the step memory's address, the attention split plans), so a
// step of hundreds of kernels costs one launch. The step's token upload and the logits copy stay
// outside the graph (host memory); the kernels read the tokens from the device.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "base/status.h"

namespace g4::cuda {

class StepGraph {
 public:
  StepGraph() = default;
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;
  ~StepGraph() { Reset(); }

  // Launches the graph captured for `key` on `stream`, capturing enqueue()'s launches (which must
  // all go to `stream`) as a new graph first when the key differs. Errors: enqueue()'s, or
  // Internal naming the CUDA call that failed (nothing is left captured or half-recorded).
  Status Launch(const std::vector<uintptr_t>& key, cudaStream_t stream, const std::function<Status()>& enqueue) {
    if (exec_ == nullptr || key != key_) {
      Reset();
      G4_RETURN_IF_ERROR(Check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "beginning the capture"));
      const Status s = enqueue();
      cudaGraph_t graph = nullptr;
      const cudaError_t end = cudaStreamEndCapture(stream, &graph);
      if (!s.ok() || end != cudaSuccess) {
        if (graph != nullptr) cudaGraphDestroy(graph);
        cudaGetLastError();  // the capture's error is reported here, not by the next launch
        return s.ok() ? Check(end, "ending the capture") : s;
      }
      const cudaError_t inst = cudaGraphInstantiate(&exec_, graph, 0);
      cudaGraphDestroy(graph);
      if (inst != cudaSuccess) {
        exec_ = nullptr;
        return Check(inst, "instantiating the graph");
      }
      key_ = key;
    }
    return Check(cudaGraphLaunch(exec_, stream), "launching the graph");
  }
  void Reset() {
    if (exec_ != nullptr) cudaGraphExecDestroy(exec_);
    exec_ = nullptr;
    key_.clear();
  }

 private:
  static Status Check(cudaError_t e, const char* what) {
    if (e == cudaSuccess) return OkStatus();
    return Internal(std::string("CUDA graph of the decode step: ") + what + ": " + cudaGetErrorString(e));
  }
  cudaGraphExec_t exec_ = nullptr;
  std::vector<uintptr_t> key_;
};

}  // namespace g4::cuda
