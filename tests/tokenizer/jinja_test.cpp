// The Jinja interpreter: expected outputs are what Jinja 3.1 (as transformers configures
// it) renders; tests/oracles/tokenizer/jinja_cases.py checks many more against jinja2 itself.
#include <gtest/gtest.h>

#include "pagellm/common/check.h"
#include "pagellm/tokenizer/chat_template.h"
#include "pagellm/tokenizer/jinja.h"

namespace pagellm::jinja {
namespace {

std::string render(const std::string& source, std::vector<std::pair<std::string, Value>> vars = {}) {
  return Template(source).render(vars);
}

Value messages() {
  return Value::from_json(nlohmann::ordered_json::parse(
      R"([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}])"));
}

std::string error_of(const std::string& source, std::vector<std::pair<std::string, Value>> vars = {}) {
  try {
    render(source, vars);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Jinja, TrimAndLstripBlocks) {
  EXPECT_EQ(render("  {% if true %}\n  x\n  {%- endif %}\n   {# c #}\ny"), "  xy");
  EXPECT_EQ(render("a  {{- ' b ' -}}  c"), "a b c");
  EXPECT_EQ(render("{%+ if true %}x{% endif %}"), "x");
  EXPECT_EQ(render("line\n"), "line");                     // one trailing newline is dropped
  EXPECT_EQ(render("{% if true %}\r\nA\r\n{% endif %}"), "A\n");  // newlines normalized
  EXPECT_EQ(render("{% raw %}{{ x }}{% endraw %}"), "{{ x }}");
}

TEST(Jinja, LoopsAndScopes) {
  EXPECT_EQ(render("{% for m in messages %}{{ loop.index0 }}{{ m.role }}{{ ',' if not loop.last }}{% endfor %}",
                   {{"messages", messages()}}),
            "0user,1assistant");
  // A set inside a loop body lives for one iteration; namespaces carry state out.
  EXPECT_EQ(render("{% set x = 1 %}{% for i in [1, 2] %}{% if i == 2 %}{% set x = 5 %}{% endif %}[{{ x }}]{% endfor %}{{ x }}"),
            "[1][5]1");
  EXPECT_EQ(render("{% set ns = namespace(n=0) %}{% for i in range(4) %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}"),
            "6");
  // A namespace that holds itself (directly or through a list) renders, and the render
  // frees it: LeakSanitizer checks that in suite_address_sanitizer (jinja_fuzz found the leak).
  EXPECT_EQ(render("{% set ns = namespace(n=1) %}{% set ns.self = ns %}{% set ns.l = [ns] %}{{ ns.self.n }}"),
            "1");
  // Printed, such a value shows its inner occurrence as Python's repr does ("(...)",
  // "{...}": the container already being printed) instead of recursing until the stack
  // runs out (jinja_fuzz found the overflow). Both strings are what jinja2 prints.
  EXPECT_EQ(render("{% set ns = namespace(n=0) %}{% set ns.n = ns, 7 %}{{ ns.n }}"),
            "(<Namespace {'n': (...)}>, 7)");
  EXPECT_EQ(render("{% set ns = namespace(a=1) %}{% set ns.l = [ns, [ns]] %}{{ ns }}"),
            "<Namespace {'a': 1, 'l': [<Namespace {...}>, [<Namespace {...}>]]}>");
  EXPECT_EQ(render("{% for i in range(10) %}{% if i == 1 %}{% continue %}{% endif %}{% if i > 3 %}{% break %}{% endif %}{{ i }}{% endfor %}"),
            "023");
  EXPECT_EQ(render("{% for x in [] %}x{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(render("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}{{ v }}{% endfor %}"), "a1b2");
  EXPECT_EQ(render("{% for m in messages[::-1] %}{{ m.content }}{% endfor %}", {{"messages", messages()}}), "HelloHi");
}

TEST(Jinja, PythonValues) {
  EXPECT_EQ(render("{{ [1, 'a', none, true, 1.5, {'k': \"it's\"}] }}"), "[1, 'a', None, True, 1.5, {'k': \"it's\"}]");
  EXPECT_EQ(render("{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 1e16 }} {{ 0.00001 }}"),
            "3 -4 2 3.5 1024 1e+16 1e-05");
  EXPECT_EQ(render("{{ 'a' ~ 1 ~ none }} {{ 'ab' * 2 }} {{ 1 == 1.0 }} {{ 'b' in ['a', 'b'] }}"), "a1None abab True True");
  EXPECT_EQ(render("{{ '  x y  '.strip() }}|{{ 'a,b'.split(',') }}|{{ 'abc'.startswith('ab') }}|{{ 'héllo'[1:3] }}"),
            "x y|['a', 'b']|True|él");
  EXPECT_EQ(render("{{ x is defined }} {{ x | default('d') }} {{ none is none }} {{ 3 is odd }}"), "False d True True");
}

TEST(Jinja, TojsonIsPythonJsonDumps) {
  const Value v = Value::from_json(nlohmann::ordered_json::parse(R"({"b": 1, "a": [1.5, "é\n", null, true]})"));
  EXPECT_EQ(render("{{ v | tojson }}", {{"v", v}}), R"({"b": 1, "a": [1.5, "é\n", null, true]})");
  EXPECT_EQ(render("{{ v | tojson(indent=2, sort_keys=true) }}", {{"v", v}}),
            "{\n  \"a\": [\n    1.5,\n    \"é\\n\",\n    null,\n    true\n  ],\n  \"b\": 1\n}");
  EXPECT_EQ(render("{{ 'ü' | tojson(ensure_ascii=true) }}"), "\"\\u00fc\"");
}

TEST(Jinja, Macros) {
  EXPECT_EQ(render("{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('A') }} {{ greet('B', punct='?') }}"),
            "Hi A! Hi B?");
}

TEST(Jinja, ErrorsNameTheConstruct) {
  EXPECT_NE(error_of("text\n{% include 'x.html' %}").find("line 2: unsupported Jinja construct: {% include %}"),
            std::string::npos);
  EXPECT_NE(error_of("{{ x | frobnicate }}").find("unsupported Jinja filter 'frobnicate'"), std::string::npos);
  EXPECT_NE(error_of("{{ x is frobnicated }}").find("unsupported Jinja test 'frobnicated'"), std::string::npos);
  EXPECT_NE(error_of("{% for x in y %}").find("expected {% endfor %}"), std::string::npos);
  EXPECT_NE(error_of("{{ raise_exception('roles must alternate') }}").find("roles must alternate"), std::string::npos);
  EXPECT_NE(error_of("{{ missing.attr }}").find("'missing' is undefined"), std::string::npos);
  EXPECT_NE(error_of("{{ 'a' + 1 }}").find("can only concatenate str"), std::string::npos);
  EXPECT_NE(error_of("{% break %}").find("outside of a for loop"), std::string::npos);
  EXPECT_NE(error_of("{{ 'x' % 3 }}").find("printf-style"), std::string::npos);
}

TEST(Jinja, IntegerResultsPast64BitsAreErrors) {
  // Python's ints are unbounded; ours are 64-bit, and a result past them is an error (a
  // fuzzer's input, `72 ** 10 * 3`, once overflowed silently).
  const std::string min = "(-9223372036854775807 - 1)";
  EXPECT_EQ(render("{{ " + min + " }} {{ 9223372036854775806 + 1 }} {{ " + min + " // 1 }} {{ " +
                   min + " % -1 }} {{ -7 // -1 }}"),
            "-9223372036854775808 9223372036854775807 -9223372036854775808 0 7");
  // Powers up to the edges: (-2) ** 63 is the least int64, 3 ** 39 squares 3 ** 32 last.
  EXPECT_EQ(render("{{ (-2) ** 63 }} {{ 3 ** 39 }} {{ 1 ** 9223372036854775807 }}"),
            "-9223372036854775808 4052555153018976267 1");
  for (const std::string& source : std::vector<std::string>{
           "{{ 72 ** 10 * 3 }}", "{{ 9223372036854775807 + 1 }}", "{{ " + min + " - 1 }}",
           "{{ " + min + " // -1 }}", "{{ -" + min + " }}", "{{ 4611686018427387904 * 2 }}",
           "{{ 2 ** 63 }}", "{{ (-3) ** 40 }}", "{{ 2 ** 64 }}"}) {
    EXPECT_NE(error_of(source).find("overflows 64 bits"), std::string::npos)
        << source << ": " << error_of(source);
  }
}

TEST(Jinja, RepeatingAnEmptySequenceIsImmediate) {
  // A repeat count with nothing to repeat once looped over the count: 10 ** 18 empty
  // appends, a template that never ended.
  EXPECT_EQ(render("[{{ '' * 1000000000000000000 }}]"), "[]");
  EXPECT_EQ(render("{{ ([] * 1000000000000000000) | length }}"), "0");
  EXPECT_EQ(render("{{ 1000000000000000000 * '' }}|{{ 'ab' * 3 }}|{{ 'ab' * -2 }}"), "|ababab|");
}

TEST(Jinja, RangeEndsAtTheEdgeOf64Bits) {
  // The step past the last item would leave int64: the range ends there, as Python's
  // (unbounded) range would, rather than overflowing.
  EXPECT_EQ(render("{{ range(9223372036854775800, 9223372036854775807, 100) | list }}"),
            "[9223372036854775800]");
  EXPECT_EQ(render("{{ range(-9223372036854775800, -9223372036854775807 - 1, -100) | list }}"),
            "[-9223372036854775800]");
  EXPECT_EQ(render("{{ range(5, 0, -2) | list }}"), "[5, 3, 1]");
  // Slices too: the step past the last index would leave int64.
  EXPECT_EQ(render("{{ 'abc'[2:3:9223372036854775807] }}|{{ [1, 2, 3][1::9223372036854775807] }}"
                   "|{{ 'abc'[::-9223372036854775807 - 1] }}|{{ 'abcdef'[1::2] }}"),
            "c|[2]|c|bdf");
}

TEST(Jinja, FloatRepr) {
  EXPECT_EQ(float_repr(1.0), "1.0");
  EXPECT_EQ(float_repr(0.1), "0.1");
  EXPECT_EQ(float_repr(1e16), "1e+16");
  EXPECT_EQ(float_repr(1e15), "1000000000000000.0");
  EXPECT_EQ(float_repr(0.0001), "0.0001");
  EXPECT_EQ(float_repr(1.5e-7), "1.5e-07");
  EXPECT_EQ(float_repr(-0.0), "-0.0");
  EXPECT_EQ(float_repr(0.1 + 0.2), "0.30000000000000004");
}

TEST(ChatTemplate, TransformersPreprocessing) {
  // None-valued keys are dropped; reasoning fields are aliased.
  ChatTemplate t("{% for m in messages %}{{ m | tojson }}\n{% endfor %}{{ eos_token }}",
                 nlohmann::ordered_json{{"eos_token", "</s>"}});
  ChatRequest request = ChatRequest::from_json(nlohmann::ordered_json::parse(
      R"([{"role": "assistant", "content": "a", "reasoning": "r", "name": null}])"));
  EXPECT_EQ(t.render(request),
            "{\"thinking\": \"r\", \"role\": \"assistant\", \"content\": \"a\", \"reasoning\": \"r\", "
            "\"reasoning_content\": \"r\"}\n</s>");
}

TEST(ChatTemplate, RequestShapes) {
  const ChatRequest request = ChatRequest::from_json(nlohmann::ordered_json::parse(
      R"({"messages": [], "tools": [{"type": "function"}], "add_generation_prompt": true, "enable_thinking": false})"));
  EXPECT_TRUE(request.add_generation_prompt);
  EXPECT_EQ(request.tools.size(), 1u);
  EXPECT_EQ(request.variables, nlohmann::ordered_json({{"enable_thinking", false}}));
  try {
    ChatRequest::from_json(nlohmann::ordered_json::parse(R"({"msgs": []})"));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("\"messages\""), std::string::npos);
  }
}

}  // namespace
}  // namespace pagellm::jinja
