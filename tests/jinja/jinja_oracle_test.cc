// The Jinja interpreter against Python jinja2 as transformers configures it: feature snippets
// (whitespace control, filters, tests, methods, slices, loops, namespaces, macros, tojson, errors)
// and every published chat template fixture (tests/data/chat_templates) with many conversations,
// compared with apply_chat_template's output string. jinja_oracle.py writes the references once
// per script version into the build tree.
#include <gtest/gtest.h>

#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>

#include "common/jinja/template.h"
#include "nlohmann/json.hpp"
#include "tests/common/python_oracle.h"
#include "tests/common/read_file.h"

namespace dflash::jinja {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

// Today's local date: Llama 3.x templates render it (strftime_now), so the references hold for the
// day they were written and are written again on another (a build tree used across midnight).
std::string Today() {
  const std::time_t now = std::time(nullptr);
  char day[16];
  std::strftime(day, sizeof(day), "%Y-%m-%d", std::localtime(&now));
  return day;
}

std::vector<json> ReadCases(const std::string& file) {
  const std::string error = dflash::testing::RunPythonOracleOnce(
      DFLASH_PYTHON, DFLASH_JINJA_ORACLE_SCRIPT, fs::path(DFLASH_JINJA_ORACLE_DIR), "",
      "rendered on " + Today());
  EXPECT_EQ(error, "");
  std::vector<json> cases;
  std::ifstream in(fs::path(DFLASH_JINJA_ORACLE_DIR) / file);
  for (std::string line; std::getline(in, line);) cases.push_back(json::parse(line));
  return cases;
}

ValueDict Variables(const json& vars) {
  ValueDict out;
  for (auto it = vars.begin(); it != vars.end(); ++it)
    out.emplace_back(it.key(), Value::FromJson(*it));
  return out;
}

TEST(JinjaOracleTest, SnippetsRenderAsJinja2) {
  const std::vector<json> cases = ReadCases("snippets.jsonl");
  ASSERT_GE(cases.size(), 30u);
  for (const json& c : cases) {
    const std::string name = c.at("name");
    SCOPED_TRACE(name);
    absl::StatusOr<Template> t = Template::Parse(c.at("source"), name);
    ASSERT_TRUE(t.ok()) << t.status();
    absl::StatusOr<std::string> text = t->Render(Variables(c.at("variables")));
    if (c.contains("error")) {
      EXPECT_FALSE(text.ok()) << "jinja2 raised " << c.at("error") << " but we rendered " << *text;
      if (!text.ok()) {
        EXPECT_NE(text.status().message().find(name + ":1:"), std::string::npos) << text.status();
      }
    } else {
      ASSERT_TRUE(text.ok()) << text.status();
      EXPECT_EQ(*text, c.at("text").get<std::string>());
    }
  }
}

TEST(JinjaOracleTest, PublishedChatTemplatesRenderAsApplyChatTemplate) {
  const std::vector<json> cases = ReadCases("fixtures.jsonl");
  ASSERT_GE(cases.size(), 500u);
  std::map<std::string, Template> templates;
  std::map<std::string, int> checked;
  int mismatches = 0;
  for (const json& c : cases) {
    const std::string name = c.at("template");
    if (!templates.count(name)) {
      const fs::path fixture = fs::path(DFLASH_CHAT_TEMPLATE_FIXTURES) / (name + ".jinja");
      ASSERT_EQ(dflash::testing::ReadFileText(fixture.string()), c.at("source").get<std::string>())
          << fixture << " changed since the oracle ran: delete " << DFLASH_JINJA_ORACLE_DIR;
      absl::StatusOr<Template> t = Template::Parse(c.at("source"), name + ".jinja");
      ASSERT_TRUE(t.ok()) << t.status();
      templates.emplace(name, *std::move(t));
    }
    ValueDict vars = Variables(c.at("variables"));
    vars.emplace_back("messages", Value::FromJson(c.at("messages")));
    absl::StatusOr<std::string> text = templates.at(name).Render(vars);
    ASSERT_TRUE(text.ok()) << text.status();
    ++checked[name];
    if (*text != c.at("text").get<std::string>() && ++mismatches <= 5) {
      ADD_FAILURE() << name << " " << c.at("messages").dump() << " vars "
                    << c.at("variables").dump() << "\n ours: " << json(*text).dump()
                    << "\n hf:   " << c.at("text").dump();
    }
  }
  EXPECT_EQ(mismatches, 0);
  for (const char* name : {"smollm2", "qwen3", "llama3_2", "llama3_3"}) {
    EXPECT_GE(checked[name], 100) << name;
  }
}

}  // namespace
}  // namespace dflash::jinja
