// The Jinja interpreter without Python: unsupported syntax and failing operations are errors that
// name the template, line and column (never a silently different render); a few renders whose
// results follow from jinja2's documented rules.
#include <gtest/gtest.h>

#include "common/jinja/template.h"

namespace dflash::jinja {
namespace {

std::string ParseError(const std::string& source) {
  absl::StatusOr<Template> t = Template::Parse(source, "t.jinja");
  return t.ok() ? "parsed" : std::string(t.status().message());
}

absl::StatusOr<std::string> Render(const std::string& source, ValueDict vars = {}) {
  absl::StatusOr<Template> t = Template::Parse(source, "t.jinja");
  if (!t.ok()) return t.status();
  return t->Render(vars);
}

TEST(JinjaTest, UnsupportedStatementsNameLineAndColumn) {
  EXPECT_EQ(ParseError("ok\n  {% include 'other.jinja' %}"),
            "t.jinja:2:3: unsupported statement 'include'");
  EXPECT_EQ(ParseError("{% extends 'base' %}"), "t.jinja:1:1: unsupported statement 'extends'");
  EXPECT_EQ(ParseError("{% for x in l recursive %}{% endfor %}"),
            "t.jinja:1:15: recursive loops are not supported");
  EXPECT_EQ(ParseError("a\nb {{ x | frobnicate }}"), "t.jinja:2:10: unknown filter 'frobnicate'");
  EXPECT_EQ(ParseError("{% if x is prime %}{% endif %}"), "t.jinja:1:12: unknown test 'prime'");
  EXPECT_EQ(ParseError("{{ f(*args) }}"), "t.jinja:1:6: *args / **kwargs are not supported");
}

TEST(JinjaTest, MalformedTemplatesNameLineAndColumn) {
  EXPECT_EQ(ParseError("x {{ 'a' "), "t.jinja:1:3: unterminated tag (no '}}')");
  EXPECT_EQ(ParseError("{{ 'abc }}"), "t.jinja:1:4: unterminated string literal");
  EXPECT_EQ(ParseError("{# note"), "t.jinja:1:1: unterminated comment");
  EXPECT_EQ(ParseError("{% for x in l %}\n{{ x }}"),
            "t.jinja:2:8: unexpected end of template, expected 'else'");
  EXPECT_EQ(ParseError("{{ a b }}"), "t.jinja:1:6: unexpected 'b'");
  EXPECT_EQ(ParseError("{{ a ; }}"), "t.jinja:1:6: unexpected character ';'");
}

TEST(JinjaTest, FailingOperationsNameTheirPosition) {
  absl::StatusOr<std::string> r = Render("{{ 'É'.upper() }}");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(),
            "t.jinja:1:7: upper() of non-ASCII text is not supported (Unicode case mapping)");
  r = Render("\n{{ raise_exception('no tools here') }}");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(r.status().message(), "t.jinja:2:19: the template raised an exception: no tools here");
  r = Render("{{ 1 + 'a' }}");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "t.jinja:1:6: unsupported operand types for +: 'int' and 'str'");
  r = Render("{% set x = 1 %}{% set x.a = 2 %}");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(),
            "t.jinja:1:16: cannot assign attribute on non-namespace object 'x'");
}

TEST(JinjaTest, WhitespaceControlAsTransformersConfiguresIt) {
  // trim_blocks drops the newline after a block tag; lstrip_blocks the indentation before it.
  EXPECT_EQ(*Render("{% for x in l %}\n  {% if x %}\n{{ x }}\n  {% endif %}\n{% endfor %}",
                    {{"l", Value::List({Value(1), Value(0), Value(2)})}}),
            "1\n2\n");
  EXPECT_EQ(*Render("a \n {{- 'b' -}} \n c"), "abc");
}

TEST(JinjaTest, MessagesLikeTransformersPassesThem) {
  ValueDict vars = {
      {"messages", Value::List({Value::Dict({{"role", "user"}, {"content", " hi "}})})},
      {"add_generation_prompt", Value(true)},
      {"bos_token", Value("<s>")}};
  EXPECT_EQ(*Render("{{ bos_token }}{% for m in messages %}[{{ m.role }}:{{ m['content'] | trim }}]"
                    "{% endfor %}{% if add_generation_prompt %}>{% endif %}"
                    "{% if enable_thinking is defined %}!{% endif %}",
                    vars),
            "<s>[user:hi]>");
}

}  // namespace
}  // namespace dflash::jinja
