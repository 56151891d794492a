#include "graph/graph.h"

#include <sstream>

#include "base/check.h"

namespace g4 {

const char* Graph::OpName(const OpAttrs& op) {
  static const char* kNames[] = {"Embed", "MatMul", "RmsNorm", "Rope", "Attention", "KvWrite", "GeGlu",
                                 "Add", "Scale", "Softcap", "Slice", "SelectRows", "MoE"};
  return kNames[op.index()];
}

int Graph::Add(OpAttrs op, std::vector<int> inputs, int cols, std::string name) {
  const int id = static_cast<int>(nodes_.size());
  for (int in : inputs) G4_CHECK(in >= 0 && in < id && nodes_[in].cols > 0);
  Rows rows = inputs.empty() ? Rows::kTokens : nodes_[inputs[0]].rows;
  for (int in : inputs) {
    // Attention/KvWrite mix only token-row values; elementwise ops need equal rows.
    G4_CHECK(nodes_[in].rows == rows);
  }
  if (std::holds_alternative<SelectRowsOp>(op)) {
    G4_CHECK(rows == Rows::kTokens);
    rows = Rows::kOutputRows;
  }
  if (std::holds_alternative<AttentionOp>(op) || std::holds_alternative<KvWriteOp>(op) ||
      std::holds_alternative<RopeOp>(op) || std::holds_alternative<EmbedOp>(op)) {
    G4_CHECK(rows == Rows::kTokens);
  }
  nodes_.push_back(Node{std::move(op), std::move(inputs), cols, rows, std::move(name)});
  return id;
}

std::string Graph::Dump() const {
  std::ostringstream s;
  for (size_t i = 0; i < nodes_.size(); ++i) {
    const Node& n = nodes_[i];
    s << "%" << i << " = " << OpName(n.op) << "(";
    for (size_t j = 0; j < n.inputs.size(); ++j) s << (j ? ", %" : "%") << n.inputs[j];
    s << ") [" << (n.rows == Rows::kTokens ? "tokens" : "out_rows") << " x " << n.cols << "]";
    if (!n.name.empty()) s << " " << n.name;
    s << "\n";
  }
  return s.str();
}

}  // namespace g4
