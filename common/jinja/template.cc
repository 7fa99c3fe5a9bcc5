#include "common/jinja/template.h"

#include "common/base/status.h"
#include "common/jinja/interpreter.h"
#include "common/jinja/lexer.h"
#include "common/jinja/parser.h"

namespace dflash::jinja {

absl::StatusOr<Template> Template::Parse(std::string source, std::string name) {
  Template t;
  t.source_ = std::make_shared<const std::string>(std::move(source));
  t.name_ = std::make_shared<const std::string>(std::move(name));
  ASSIGN_OR_RETURN(std::vector<Segment> segments, Lex(*t.name_, *t.source_));
  ASSIGN_OR_RETURN(Body body, jinja::Parse(*t.name_, *t.source_, segments));
  t.body_ = std::make_shared<const Body>(std::move(body));
  return t;
}

absl::StatusOr<std::string> Template::Render(const ValueDict& variables) const {
  Interpreter interpreter(*name_, source_, variables);
  std::string out;
  RETURN_IF_ERROR(interpreter.Exec(*body_, &out));
  return out;
}

}  // namespace dflash::jinja
