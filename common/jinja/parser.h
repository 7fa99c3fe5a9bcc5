// Parses lexed Jinja segments into a statement tree. Supported statements: if/elif/else, for (with
// tuple targets, an inline `if` filter and else), set (names, tuples, namespace attributes, set
// blocks), macro, break/continue, generation; anything else (include, extends, block, raw, call,
// filter blocks, with, import, unknown filters and tests) is an error naming the line and column.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/jinja/ast.h"
#include "common/jinja/lexer.h"

namespace dflash::jinja {

absl::StatusOr<Body> Parse(absl::string_view name, absl::string_view source,
                           const std::vector<Segment>& segments);

}  // namespace dflash::jinja
