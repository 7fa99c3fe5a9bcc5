// A Jinja2 subset interpreter for chat templates: parses a template once and renders it with the
// variables transformers' apply_chat_template passes (messages, add_generation_prompt, the
// special tokens, tools=None, ...), with jinja2's semantics under transformers' environment:
// trim_blocks and lstrip_blocks on, the loopcontrols extension (break/continue), the {% generation
// %} tag, tojson as json.dumps(ensure_ascii=False), raise_exception and strftime_now globals.
//
// Supported: text, {{ }}, comments, whitespace control (- and +), if/elif/else, for (tuple
// targets, inline if, else, loop.index/index0/revindex/revindex0/first/last/length/previtem/
// nextitem), set (names, tuples, namespace attributes, blocks), macro, break, continue, literals
// (str, int, float, bool, none, list, tuple, dict), arithmetic, ~, comparisons, in, and/or/not,
// conditional expressions, attribute and item access, slices ([::-1]), calls with keyword
// arguments, the filters and tests of builtins.h and the str/dict methods. Anything else is an
// error that names the template and the line and column: at parse time for unknown statements,
// filters and tests; at render time for unsupported operations (e.g. Unicode case mapping) - never
// a silently different output.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/jinja/ast.h"
#include "common/jinja/value.h"

namespace dflash::jinja {

class Template {
 public:
  // `name` is how errors call the template (e.g. "tokenizer_config.json:chat_template").
  static absl::StatusOr<Template> Parse(std::string source, std::string name);

  // Renders with `variables` (above the global functions). Errors name the template, line and
  // column; raise_exception(...) is FailedPrecondition carrying the template's message.
  absl::StatusOr<std::string> Render(const ValueDict& variables) const;

  const std::string& name() const { return *name_; }
  const std::string& source() const { return *source_; }

 private:
  std::shared_ptr<const std::string> source_, name_;
  std::shared_ptr<const Body> body_;
};

}  // namespace dflash::jinja
