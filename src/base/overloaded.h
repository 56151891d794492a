// A visitor of a std::variant from lambdas, one per alternative:
// std::visit(Overloaded{[](const A&) {...}, [](const B&) {...}}, v).
#pragma once

namespace g4 {

template <class... Ts>
struct Overloaded : Ts... {
  using Ts::operator()...;
};
template <class... Ts>
Overloaded(Ts...) -> Overloaded<Ts...>;

}  // namespace g4
