// lib/chat's Jinja engine: each construct against what jinja2 renders with transformers' settings,
// and each refusal. The expected strings of the tables were produced by jinja2 3.1.6 through
// transformers' own environment (chat_template_utils), with strftime_now's clock fixed at kNow
// in UTC; tests/chat/chat_template_python_test.py compares whole real chat templates.
#include "chat/jinja.h"

#include <doctest/doctest.h>

#include <cstdlib>
#include <ctime>
#include <string>
#include <thread>
#include <vector>

namespace {

using fsdp::chat::Json;
using fsdp::chat::Template;
using fsdp::chat::TemplateRaise;

constexpr std::time_t kNow = 1718000000;  // 2024-06-10 06:13:20 UTC

struct Case {
  const char* src;
  const char* vars;
  const char* expected;
};

void use_utc() {
  setenv("TZ", "UTC", 1);
  tzset();
}

Template::Output render_output(const std::string& src, const std::string& vars = "{}") {
  use_utc();
  return Template(src, "t.jinja").render(Json::parse(vars), kNow);
}

std::string render(const std::string& src, const std::string& vars = "{}") {
  return render_output(src, vars).text;
}

// The message of the InputError rendering throws ("" when it renders).
std::string error_of(const std::string& src, const std::string& vars = "{}") {
  try {
    render(src, vars);
  } catch (const fsdp::InputError& e) {
    return e.what();
  }
  return "";
}

template <size_t N>
void check_cases(const Case (&cases)[N]) {
  for (const Case& c : cases) {
    const std::string src = c.src;
    CAPTURE(src);
    CHECK(render(c.src, c.vars) == c.expected);
  }
}

// Whitespace
const Case kWhitespace[] = {
    {"{% if true %}\nA\n{% endif %}\nB", "{}", "A\nB"},
    {"  {% if true %}\n  x\n  {% endif %}\n  {{ 'y' }}  \n{# c #}\nz\n", "{}", "  x\n  y  \nz"},
    {"a  {%- if true -%}  b  {%- endif -%}  c", "{}", "abc"},
    {"  {%+ if true %}d{% endif %}|{% if true +%}\ne{% endif %}", "{}", "  d|\ne"},
    {"x {{- ' y ' -}} z", "{}", "x y z"},
    {"{{ 'a' }}   {% if true %}b{% endif %}", "{}", "a   b"},
    {"line\n    {# comment #}\nnext", "{}", "line\nnext"},
    {"a　 {%- if true %}b{% endif %}", "{}", "ab"},
    {"crlf\r\n{% if true %}\r\nx\r\n{% endif %}\r\nend\r\n", "{}", "crlf\nx\nend"},
    {"trailing newline kept once\n\n", "{}", "trailing newline kept once\n"},
    {"{% raw %}{{ not rendered }} {% if %}{% endraw %}\nafter", "{}", "{{ not rendered }} {% if %}after"},
    {"{%- raw -%}  spaced  {%- endraw -%}  x", "{}", "spacedx"},
    {"{{ {'a': {'b': 1}} }}", "{}", "{'a': {'b': 1}}"},
};
// Literals
const Case kLiterals[] = {
    {"{{ 'single' }}{{ \"double\" }}{{ 'it\\'s' }}{{ 'a\\nb\\tc' }}{{ '\\x41\\u00e9\\U0001F600' }}{{ '\\d\\101' }}{{ "
     "'con' 'cat' }}",
     "{}", "singledoubleit'sa\nb\tcAé😀\\dAconcat"},
    {"{{ 0x1F }} {{ 0b101 }} {{ 0o17 }} {{ 1_000 }} {{ 1.5 }} {{ 1e3 }} {{ 2.5E-3 }} {{ 1_0.0_1 }}", "{}",
     "31 5 15 1000 1.5 1000.0 0.0025 10.01"},
    {"{{ true }}{{ True }}{{ false }}{{ False }}{{ none }}{{ None }}", "{}", "TrueTrueFalseFalseNoneNone"},
    {"{{ [1, 'a', [2]] }}{{ (1,) }}{{ () }}{{ (1, 2) }}{{ {'k': 'v', 1: none} }}{{ [] }}{{ {} }}{{ [1,] }}", "{}",
     "[1, 'a', [2]](1,)()(1, 2){'k': 'v', 1: None}[]{}[1]"},
};
// Operators
const Case kOperators[] = {
    {"{{ 7 + 2 }} {{ 7 - 9 }} {{ 3 * 4 }} {{ 7 / 2 }} {{ 8 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} "
     "{{ 2 ** 10 }} {{ 2 ** -1 }}",
     "{}", "9 -2 12 3.5 4.0 3 -4 1 2 1024 0.5"},
    {"{{ 7.5 // 2 }} {{ -7.5 % 2 }} {{ 1 + 1.5 }} {{ true + 1 }} {{ 0.1 + 0.2 }} {{ 10 / 4 }} {{ 2 ** 0.5 }}", "{}",
     "3.0 0.5 2.5 2 0.30000000000000004 2.5 1.4142135623730951"},
    {"{{ -2 ** 2 }} {{ -1|abs }} {{ 2 + 3 * 4 }} {{ (2 + 3) * 4 }} {{ 'a' ~ 2 * 3 }} {{ 'a' ~ none ~ true ~ 1.0 }}",
     "{}", "4 1 14 20 a6 aNoneTrue1.0"},
    {"{{ 'ab' + 'cd' }} {{ 'ab' * 2 }} {{ 3 * 'x' }} {{ [1] + [2] }} {{ (1,) + (2,) }} {{ [0] * 3 }}", "{}",
     "abcd abab xxx [1, 2] (1, 2) [0, 0, 0]"},
    {"{{ 1 < 2 < 3 }}{{ 1 < 3 < 2 }}{{ 2 >= 2 }}{{ 'a' < 'b' }}{{ [1, 2] < [1, 3] }}{{ 1 == 1.0 }}{{ true == 1 }}{{ "
     "'a' != 'b' }}",
     "{}", "TrueFalseTrueTrueTrueTrueTrueTrue"},
    {"{{ 'a' in 'cat' }}{{ 1 not in [2] }}{{ 'k' in {'k': 1} }}{{ 2 in (1, 2) }}{{ 'x' in undefined_name }}", "{}",
     "TrueTrueTrueTrueFalse"},
    {"{{ 0 or 'x' }}|{{ 'a' and 'b' }}|{{ [] and 1 }}|{{ none or [] }}|{{ not 0 }}|{{ not 'a' }}", "{}",
     "x|b|[]|[]|True|False"},
    {"{{ 'y' if true else 'n' }}{{ 'y' if false else 'n' }}[{{ 'y' if false }}]{{ 1 if 0 else 2 if 0 else 3 }}", "{}",
     "yn[]3"},
    {"{{ none == none }}{{ x == y }}{{ x is none }}{{ 1 is number and 2 is number }}", "{\"x\": null}",
     "TrueFalseTrueTrue"},
};
// Printing
const Case kPrinting[] = {
    {"{{ ['a', \"it's\", 'q\"', 'both\\'\"', '\\n\\t\\\\'] }}", "{}",
     "['a', \"it's\", 'q\"', 'both\\'\"', '\\n\\t\\\\']"},
    {"{{ ['\\x01\\x7f', ' ​ ', 'é😀中', '󠀁'] }}", "{}",
     "['\\x01\\x7f', '\\xa0\\u200b\\u2028', 'é😀中', '\\U000e0001']"},
    {"{{ 1e16 }} {{ 1e15 }} {{ 0.0001 }} {{ 0.00001 }} {{ -0.0 }} {{ 1/3 }} {{ 2.5e-7 }} {{ 123456789.123 }} {{ 1e100 "
     "}} {{ 1.0 }}",
     "{}", "1e+16 1000000000000000.0 0.0001 1e-05 -0.0 0.3333333333333333 2.5e-07 123456789.123 1e+100 1.0"},
    {"{{ x }} {{ y }} {{ z }} {{ [x, y, z] }}", "{\"x\": 1.0, \"y\": 1e-07, \"z\": 3}", "1.0 1e-07 3 [1.0, 1e-07, 3]"},
    {"{{ d }} {{ d.items() }} {{ d.keys() }} {{ d.values() }}",
     "{\"d\": {\"b\": [1, null, true], \"a\": {\"c\": \"é\"}}}",
     "{'b': [1, None, True], 'a': {'c': 'é'}} dict_items([('b', [1, None, True]), ('a', {'c': 'é'})]) dict_keys(['b', "
     "'a']) dict_values([[1, None, True], {'c': 'é'}])"},
    {"{{ namespace(a=1, b='x') }}|{{ range(3) }}|{{ range(1, 10, 2) }}|{{ undefined_name }}|{{ [undefined_name] }}",
     "{}", "<Namespace {'a': 1, 'b': 'x'}>|range(0, 3)|range(1, 10, 2)||[Undefined]"},
    {"{{ 'x'|safe }} {{ ['x'|safe] }}", "{}", "x [Markup('x')]"},
};
// Access
const Case kAccess[] = {
    {"{{ d.a }}{{ d['a'] }}{{ d.get('a') }}{{ d.get('zz') }}{{ d.get('zz', 5) }}[{{ d.zz }}]{{ d.zz is defined }}",
     "{\"d\": {\"a\": 1}}", "111None5[]False"},
    {"{{ d.items is callable }}|{{ d['items'] }}|{{ d.keys is defined }}", "{\"d\": {\"items\": \"key wins for []\"}}",
     "True|key wins for []|True"},
    {"{{ l[0] }}{{ l[-1] }}[{{ l[5] }}]{{ l.0 }}{{ s[1] }}{{ s[-1] }}[{{ s[10] }}]",
     "{\"l\": [1, 2, 3], \"s\": \"héllo\"}", "13[]1éo[]"},
    {"{{ s[1:3] }}|{{ s[::-1] }}|{{ s[-2:] }}|{{ l[::2] }}|{{ l[1:] }}|{{ l[:-1] }}|{{ l[5:] }}|{{ l[::-1] }}|{{ t[1:] "
     "}}",
     "{\"s\": \"héllo😀\", \"l\": [1, 2, 3, 4], \"t\": [1, 2]}",
     "él|😀olléh|o😀|[1, 3]|[2, 3, 4]|[1, 2, 3]|[]|[4, 3, 2, 1]|[2]"},
    {"[{{ none.foo }}][{{ (1).foo }}][{{ 'abc'.nope }}][{{ l['x'] }}][{{ d[0] }}]", "{\"l\": [1], \"d\": {\"a\": 1}}",
     "[][][][][]"},
    {"{{ messages[0]['content'] }}{{ messages[-1].role }}{{ messages|length }}",
     "{\"messages\": [{\"role\": \"system\", \"content\": \"Sys\"}, {\"role\": \"user\", \"content\": \"Hi\"}, "
     "{\"role\": \"assistant\", \"content\": \"Yo\"}]}",
     "Sysassistant3"},
};
// Undefined
const Case kUndefined[] = {
    {"[{{ nope }}][{{ nope|length }}][{% for x in nope %}x{% endfor %}][{{ nope|default('d') }}][{{ nope is defined "
     "}}][{{ nope is undefined }}]",
     "{}", "[][0][][d][False][True]"},
    {"[{{ nope ~ 'x' }}][{{ nope|string }}][{{ nope|list }}][{{ nope|join(',') }}][{{ nope|trim }}][{{ nope == nope "
     "}}][{{ nope|first }}]",
     "{}", "[x][][[]][][][True][]"},
    {"{% if nope %}t{% else %}f{% endif %}{% if not nope %}!{% endif %}{{ nope is iterable }}{{ nope is sequence }}{{ "
     "nope|items|list }}",
     "{}", "f!TrueTrue[]"},
};
// Control
const Case kControl[] = {
    {"{% if x == 1 %}one{% elif x == 2 %}two{% elif x == 3 %}three{% else %}many{% endif %}", "{\"x\": 2}", "two"},
    {"{% if x == 1 %}one{% elif x == 2 %}two{% else %}many{% endif %}", "{\"x\": 7}", "many"},
    {"{% for m in messages %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first "
     "}}{{ loop.last }}{{ loop.length }};{% endfor %}",
     "{\"messages\": [{\"role\": \"system\", \"content\": \"Sys\"}, {\"role\": \"user\", \"content\": \"Hi\"}, "
     "{\"role\": \"assistant\", \"content\": \"Yo\"}]}",
     "1032TrueFalse3;2121FalseFalse3;3210FalseTrue3;"},
    {"{% for x in [1, 2, 3] %}{{ loop.previtem }}-{{ loop.nextitem }}|{{ loop.cycle('a', 'b') }}|{{ loop.depth }}{% "
     "endfor %}",
     "{}", "-2|a|11-3|b|12-|a|1"},
    {"{% for x in [1, 1, 2, 2, 1] %}{{ loop.changed(x) }}{% endfor %}", "{}", "TrueFalseTrueFalseTrue"},
    {"{% for m in messages if m.role != 'system' %}{{ loop.index }}/{{ loop.length }}:{{ m.role }};{% endfor %}",
     "{\"messages\": [{\"role\": \"system\", \"content\": \"Sys\"}, {\"role\": \"user\", \"content\": \"Hi\"}, "
     "{\"role\": \"assistant\", \"content\": \"Yo\"}]}",
     "1/2:user;2/2:assistant;"},
    {"{% for x in [] %}a{% else %}empty{% endfor %}{% for x in [1] if false %}a{% else %}filtered{% endfor %}", "{}",
     "emptyfiltered"},
    {"{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for k in d %}{{ k }}{% endfor %}{% for c in 'hé' %}[{{ "
     "c }}]{% endfor %}",
     "{\"d\": {\"b\": 1, \"a\": 2}}", "b=1;a=2;ba[h][é]"},
    {"{% for a, (b, c) in [(1, (2, 3))] %}{{ a }}{{ b }}{{ c }}{% endfor %}{% for a, b in ['xy'] %}{{ b }}{{ a }}{% "
     "endfor %}",
     "{}", "123yx"},
    {"{% for x in [1, 2, 3, 4, 5] %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 4 %}{% break %}{% endif %}{{ x "
     "}}{% endfor %}",
     "{}", "13"},
    {"{% for a in [1, 2] %}{% set outer = loop %}{% for b in [3, 4] %}{{ outer.index }}{{ loop.index }} {% endfor %}{% "
     "endfor %}",
     "{}", "11 12 21 22 "},
    {"{% for x in [3, 1, 2]|sort %}{{ x }}{% endfor %}{% for i in range(2, 8, 3) %}{{ i }}{% endfor %}", "{}", "12325"},
};
// Scoping
const Case kScoping[] = {
    {"{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{{ x }}{% endfor %}{{ x }}", "{}", "21"},
    {"{% if true %}{% set x = 'leaks' %}{% endif %}{{ x }}", "{}", "leaks"},
    {"{% for i in range(3) %}{% if i == 0 %}{% set x = 'a' %}{% endif %}[{{ x }}]{% endfor %}", "{}", "[a][][]"},
    {"{% for m in [1, 2] %}[{{ x }}]{% endfor %}{% set x = 5 %}{{ x }}", "{\"x\": 1}", "[][]5"},
    {"{% macro f() %}{{ x }}{% endmacro %}{{ f() }}|{% set x = 5 %}{{ f() }}", "{\"x\": 1}", "|5"},
    {"{% set x = x + 1 %}{{ x }}{% for i in [1] %}{{ x }}{% set x = 10 %}{{ x }}{% endfor %}{{ x }}", "{\"x\": 1}",
     "22102"},
    {"{% set ns = namespace(n=0, s='') %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% set ns.s = ns.s ~ "
     "m.role[0] %}{% endfor %}{{ ns.n }}{{ ns.s }}{{ ns.missing is defined }}",
     "{\"messages\": [{\"role\": \"system\", \"content\": \"Sys\"}, {\"role\": \"user\", \"content\": \"Hi\"}, "
     "{\"role\": \"assistant\", \"content\": \"Yo\"}]}",
     "3suaFalse"},
    {"{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set t = 1, 2 %}{{ t }}", "{}", "12(1, 2)"},
    {"{% set x %}  block {{ 1 + 1 }} {% endset %}[{{ x }}]{% set y | upper %}shout{% endset %}{{ y }}", "{}",
     "[  block 2 ]SHOUT"},
    {"{% with a = 5, b = 6 %}{{ a + b }}{% endwith %}[{{ a }}]", "{}", "11[]"},
    {"{% set x = 'outer' %}{% macro f() %}{% set x = 'inner' %}{{ x }}{% endmacro %}{{ f() }}{{ x }}", "{}",
     "innerouter"},
};
// Macros
const Case kMacros[] = {
    {"{% macro f(a, b='d', c=none) %}{{ a }}-{{ b }}-{{ c }}{% endmacro %}{{ f(1) }}|{{ f(1, 2, 3) }}|{{ f(a=5, c=7) "
     "}}|{{ f() }}",
     "{}", "1-d-None|1-2-3|5-d-7|-d-None"},
    {"{% macro f(a, b=a * 2) %}{{ a }},{{ b }}{% endmacro %}{{ f(3) }}", "{}", "3,6"},
    {"{% macro f(a) %}{{ a }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ f(1, 2, 3, k='v') }}", "{}",
     "1(2, 3){'k': 'v'}"},
    {"{% macro fact(n) %}{% if n <= 1 %}1{% else %}{{ n * fact(n - 1)|int }}{% endif %}{% endmacro %}{{ fact(5) }}",
     "{}", "120"},
    {"{% macro f() %}  x  {% endmacro %}[{{ f() }}]{{ f() | trim }}{{ f }}", "{}", "[  x  ]x<Macro 'f'>"},
    {"{% filter upper %}abc {{ 'd' }}{% endfilter %}{% filter trim %}   t   {% endfilter %}", "{}", "ABC Dt"},
};
// Filters
const Case kFilters[] = {
    {"{{ '  x  '|trim }}|{{ 'xxhixx'|trim('x') }}|{{ 'hello'|upper }}|{{ 'HeLLo'|lower }}|{{ 'hELLO wORLD'|capitalize "
     "}}|{{ 'a-b c(d[e<f'|title }}",
     "{}", "x|hi|HELLO|hello|Hello world|A-B C(D[E<F"},
    {"{{ [1, 2]|length }}{{ 'héllo'|length }}{{ {'a': 1}|count }}{{ [1, 2]|first }}{{ [1, 2]|last }}{{ 'abc'|first "
     "}}{{ []|first is defined }}",
     "{}", "25112aFalse"},
    {"{{ x|default('d') }}{{ none|default('d') }}{{ none|default('d', true) }}{{ ''|d('e', true) }}{{ 0|default('z', "
     "boolean=true) }}",
     "{}", "dNonedez"},
    {"{{ [1, 2, 3]|join(', ') }}|{{ ['a', 'b']|join }}|{{ users|join(',', attribute='name') }}|{{ "
     "users|map(attribute='name')|list }}",
     "{\"users\": [{\"name\": \"ann\"}, {\"name\": \"bob\"}]}", "1, 2, 3|ab|ann,bob|['ann', 'bob']"},
    {"{{ [1, 'a']|map('string')|list }}{{ ['a', 'b']|map('upper')|join }}{{ users|map(attribute='age', default=0)|list "
     "}}",
     "{\"users\": [{\"name\": \"a\", \"age\": 3}, {\"name\": \"b\"}]}", "['1', 'a']AB[3, 0]"},
    {"{{ users|selectattr('admin')|map(attribute='name')|list }}{{ "
     "users|rejectattr('admin')|map(attribute='name')|list }}{{ users|selectattr('name', 'equalto', 'b')|list|length "
     "}}",
     "{\"users\": [{\"name\": \"a\", \"admin\": true}, {\"name\": \"b\", \"admin\": false}]}", "['a']['b']1"},
    {"{{ [1, none, 2, 0]|select|list }}{{ [1, 2, 3, 4]|select('odd')|list }}{{ [1, 2, 3]|reject('even')|list }}{{ [1, "
     "5, 9]|select('gt', 4)|list }}",
     "{}", "[1, 2][1, 3][1, 3][5, 9]"},
    {"{{ [3, 1, 2]|sort }}{{ ['b', 'A', 'a', 'C']|sort }}{{ ['b', 'A', 'a']|sort(case_sensitive=true) }}{{ [3, 1, "
     "2]|sort(reverse=true) }}{{ users|sort(attribute='age')|map(attribute='n')|join }}",
     "{\"users\": [{\"n\": \"x\", \"age\": 2}, {\"n\": \"y\", \"age\": 1}]}",
     "[1, 2, 3]['A', 'a', 'b', 'C']['A', 'a', 'b'][3, 2, 1]yx"},
    {"{{ [1, 2, 2, 3, 1]|unique|list }}{{ ['a', 'A', 'b']|unique|list }}{{ [1, 2, 3]|sum }}{{ [1.5, 2]|sum }}{{ "
     "users|sum(attribute='age') }}{{ [[1], [2]]|sum(start=[]) }}",
     "{\"users\": [{\"age\": 2}, {\"age\": 5}]}", "[1, 2, 3]['a', 'b']63.57[1, 2]"},
    {"{{ [1, 5, 3]|max }}{{ [4, 2, 8]|min }}{{ ['b', 'A', 'c']|max }}{{ users|max(attribute='age') }}{{ []|max is "
     "defined }}",
     "{\"users\": [{\"age\": 2}, {\"age\": 5}]}", "52c{'age': 5}False"},
    {"{{ d|dictsort }}{{ d|dictsort(by='value') }}{{ d|dictsort(reverse=true) }}{{ d|dictsort(true) }}{{ d|items|list "
     "}}",
     "{\"d\": {\"b\": 2, \"a\": 3, \"C\": 1}}",
     "[('a', 3), ('b', 2), ('C', 1)][('C', 1), ('b', 2), ('a', 3)][('C', 1), ('b', 2), ('a', 3)][('C', 1), ('a', 3), "
     "('b', 2)][('b', 2), ('a', 3), ('C', 1)]"},
    {"{{ 'abc'|reverse }}{{ [1, 2]|reverse|list }}{{ 'x'|string }}{{ 1|string }}{{ [1]|string }}{{ none|string }}",
     "{}", "cba[2, 1]x1[1]None"},
    {"{{ 'abc'|list }}{{ {'a': 1}|list }}{{ (1, 2)|list }}{{ range(3)|list }}", "{}",
     "['a', 'b', 'c']['a'][1, 2][0, 1, 2]"},
    {"{{ '42'|int }}{{ ' 42 '|int }}{{ '4.7'|int }}{{ 'x'|int }}{{ 'x'|int(7) }}{{ 3.9|int }}{{ -3.9|int }}{{ true|int "
     "}}{{ '1_000'|int }}{{ none|int }}",
     "{}", "42424073-3110000"},
    {"{{ '2.5'|float }}{{ 'a'|float }}{{ 3|float }}{{ ' 1e3 '|float }}{{ 'x'|float(1.5) }}", "{}",
     "2.50.03.01000.01.5"},
    {"{{ 2.675|round(2) }} {{ 2.5|round }} {{ 3.5|round }} {{ 3|round }} {{ 3.14159|round(2, 'floor') }} {{ "
     "3.1|round(0, 'ceil') }} {{ -2.5|round }}",
     "{}", "2.67 2.0 4.0 3 3.14 4.0 -2.0"},
    {"{{ -3|abs }}{{ -2.5|abs }}{{ 'a b  c_d, e'|wordcount }}{{ [1, 2, 3, 4, 5]|batch(2)|list }}{{ [1, 2, 3]|batch(2, "
     "0)|list }}",
     "{}", "32.54[[1, 2], [3, 4], [5]][[1, 2], [3, 0]]"},
    {"{{ 'a\\nb\\n\\nc'|indent }}|{{ 'a\\nb'|indent(2, true) }}|{{ 'a\\n\\nb'|indent(2, blank=true) }}|{{ "
     "'x'|indent('>>', first=true) }}|{{ 'a\\n'|indent }}",
     "{}", "a\n    b\n\n    c|  a\n  b|a\n  \n  b|>>x|a\n"},
    {"{{ 'aXbXc'|replace('X', '-') }}{{ 'aaa'|replace('a', 'b', 2) }}{{ 1|replace(1, 2) }}", "{}", "a-b-cbba2"},
    {"{{ '<a href=\"x\">&\\'</a>'|e }}|{{ '<b>'|escape|e }}|{{ '<b>'|safe }}|{{ 'x'|safe + '<b>' }}|{{ '<b>' + "
     "'x'|safe }}|{{ ('x'|safe) ~ '<' }}|{{ '<i>'|forceescape }}",
     "{}", "&lt;a href=&#34;x&#34;&gt;&amp;&#39;&lt;/a&gt;|&lt;b&gt;|<b>|x&lt;b&gt;|&lt;b&gt;x|x<|&lt;i&gt;"},
    {"{{ '%s and %s'|format('a', 'b') }}{{ '%(x)s!'|format(x=1) }}{{ 'hello %s, %d' % ('w', 3) }}{{ '%5.2f|%-4d|%03d' "
     "% (3.14159, 7, 5) }}{{ '%s' % [1] }}{{ '100%%' % () }}",
     "{}", "a and b1!hello w, 3 3.14|7   |005[1]100%"},
    {"{{ d|attr('a') }}[{{ d|attr('items') is defined }}]{{ 'x'|center(5) }}|", "{\"d\": {\"a\": 1}}", "[True]  x  |"},
    {"{{ x|tojson }}",
     "{\"x\": {\"a\": [1, 2.0, \"é \\n\\\"\\\\\\t\\u0001\", null, true], \"b\": 1e+20, \"c\": 1e-07}}",
     "{\"a\": [1, 2.0, \"é \\n\\\"\\\\\\t\\u0001\", null, true], \"b\": 1e+20, \"c\": 1e-07}"},
    {"{{ x|tojson(indent=2) }}|{{ x|tojson(indent='\\t') }}|{{ [] | tojson(indent=2) }}",
     "{\"x\": {\"a\": [1, {}], \"b\": []}}",
     "{\n  \"a\": [\n    1,\n    {}\n  ],\n  \"b\": []\n}|{\n\t\"a\": [\n\t\t1,\n\t\t{}\n\t],\n\t\"b\": []\n}|[]"},
    {"{{ x|tojson(indent=4, sort_keys=true) }}{{ x|tojson(ensure_ascii=true) }}{{ x|tojson(separators=(',', ':')) }}{{ "
     "'x'|tojson }}{{ (1, 2)|tojson }}",
     "{\"x\": {\"b\": \"é😀\", \"a\": [1, 2]}}",
     "{\n    \"a\": [\n        1,\n        2\n    ],\n    \"b\": \"é😀\"\n}{\"b\": \"\\u00e9\\ud83d\\ude00\", \"a\": "
     "[1, 2]}{\"b\":\"é😀\",\"a\":[1,2]}\"x\"[1, 2]"},
};
// Tests
const Case kTests[] = {
    {"{{ x is defined }}{{ y is defined }}{{ y is undefined }}{{ x is none }}{{ 1 is number }}{{ 1.5 is number }}{{ "
     "'a' is number }}",
     "{\"x\": null}", "TrueFalseTrueTrueTrueTrueFalse"},
    {"{{ true is boolean }}{{ 1 is boolean }}{{ false is false }}{{ 0 is false }}{{ true is true }}{{ 1 is integer "
     "}}{{ true is integer }}{{ 1.0 is float }}{{ 1 is float }}",
     "{}", "TrueFalseTrueFalseTrueTrueFalseTrueFalse"},
    {"{{ 'a' is string }}{{ 1 is string }}{{ {} is mapping }}{{ [] is mapping }}{{ [] is iterable }}{{ 'a' is iterable "
     "}}{{ 1 is iterable }}{{ {} is iterable }}",
     "{}", "TrueFalseTrueFalseTrueTrueFalseTrue"},
    {"{{ [] is sequence }}{{ 'a' is sequence }}{{ {} is sequence }}{{ 1 is sequence }}{{ none is sequence }}{{ "
     "([1]|select) is sequence }}{{ ([1]|select) is iterable }}",
     "{}", "TrueTrueTrueFalseFalseFalseTrue"},
    {"{{ 2 is even }}{{ 3 is odd }}{{ 9 is divisibleby 3 }}{{ 9 is divisibleby(2) }}{{ 2 is in [1, 2] }}{{ 'x' is eq "
     "'x' }}{{ 'x' is equalto 'y' }}{{ 3 is gt 2 }}{{ 3 is lt 2 }}{{ 3 is ge 3 }}{{ 3 is le 2 }}{{ 3 is ne 3 }}",
     "{}", "TrueTrueTrueFalseTrueTrueFalseTrueFalseTrueFalseFalse"},
    {"{{ 'AB' is upper }}{{ 'Ab' is upper }}{{ 'ab' is lower }}{{ 'upper' is filter }}{{ 'nope' is filter }}{{ 'odd' "
     "is test }}{{ f is callable }}{{ 1 is callable }}{{ none is sameas none }}{{ 'x'|safe is escaped }}{{ 'x' is "
     "escaped }}",
     "{}", "TrueFalseTrueTrueFalseTrueTrueFalseTrueTrueFalse"},
    {"{{ x is not none }}{{ x is not defined }}{{ not x is defined }}", "{\"x\": 1}", "TrueFalseFalse"},
};
// Methods
const Case kMethods[] = {
    {"{{ '  a b  c '.split() }}{{ 'a,b,,c'.split(',') }}{{ 'a,b,c'.split(',', 1) }}{{ 'a b c'.rsplit(None, 1) }}{{ '  "
     "a b  c '.split(None, 1) }}{{ 'a,b,c'.rsplit(',', 1) }}{{ ''.split() }}{{ ''.split(',') }}",
     "{}", "['a', 'b', 'c']['a', 'b', '', 'c']['a', 'b,c']['a b', 'c']['a', 'b  c ']['a,b', 'c'][]['']"},
    {"{{ 'xxhixx'.strip('x') }}|{{ '  hi '.lstrip() }}|{{ '  hi  '.rstrip() }}|{{ '\\u3000hi\\xa0'.strip() }}|{{ "
     "'abc'.startswith(('x', 'a')) }}{{ 'abc'.endswith('bc') }}{{ 'abc'.startswith('') }}",
     "{}", "hi|hi |  hi|hi|TrueTrueTrue"},
    {"{{ 'hello wORLD'.title() }} {{ 'hELLO'.capitalize() }} {{ 'Straße'.upper() }} {{ 'ÀÉÎ'.lower() }} {{ "
     "'ǆx'.title() }} {{ 'ﬁne'.upper() }} {{ 'i̇'.upper() }}",
     "{}", "Hello World Hello STRASSE àéî ǅx FINE İ"},
    {"{{ 'a{}b{}'.format(1, 'x') }}{{ '{0}{1}{0}'.format('a', 'b') }}{{ '{name}!'.format(name='n') }}{{ "
     "'{{x}}{}'.format(1) }}{{ '{0[a]}{0.a}'.format(d) }}{{ '{!r}'.format('q') }}",
     "{\"d\": {\"a\": 7}}", "a1bxaban!{x}177'q'"},
    {"{{ 'abcabc'.find('c') }}{{ 'abcabc'.rfind('c') }}{{ 'héllo'.find('l') }}{{ 'abc'.find('z') }}{{ "
     "'abcabc'.count('bc') }}{{ 'abc'.index('b') }}",
     "{}", "252-121"},
    {"{{ 'aXbXc'.replace('X', '-') }}{{ 'ab'.replace('', '.') }}{{ 'aaa'.replace('a', 'b', 1) }}{{ ', '.join(['a', "
     "'b']) }}{{ '-'.join('xyz') }}",
     "{}", "a-b-c.a.b.baaa, bx-y-z"},
    {"{{ 'a\\nb\\r\\nc'.splitlines() }}{{ 'a\\nb'.splitlines(true) }}{{ '42'.isdigit() }}{{ 'a1'.isalnum() }}{{ "
     "'ab'.isalpha() }}{{ ' \\t'.isspace() }}{{ 'ab'.islower() }}{{ 'AB'.isupper() }}",
     "{}", "['a', 'b', 'c']['a\\n', 'b']TrueTrueTrueTrueTrueTrue"},
    {"{{ '7'.zfill(3) }}{{ '-7'.zfill(3) }}|{{ 'ab'.center(6, '*') }}|{{ 'ab'.ljust(4) }}|{{ 'ab'.rjust(4) }}|{{ "
     "'a=b=c'.partition('=') }}{{ 'a=b=c'.rpartition('=') }}{{ 'prefix_x'.removeprefix('prefix_') }}{{ "
     "'x.py'.removesuffix('.py') }}",
     "{}", "007-07|**ab**|ab  |  ab|('a', '=', 'b=c')('a=b', '=', 'c')xx"},
    {"{{ [1, 2, 1].count(1) }}{{ [1, 2].index(2) }}{{ (1, 2).index(1) }}{{ [1].copy() }}{{ d.copy() }}{{ d.keys()|list "
     "}}{{ d.values()|list }}{{ d.items()|list }}",
     "{\"d\": {\"a\": 1}}", "210[1]{'a': 1}['a'][1][('a', 1)]"},
};
// Globals
const Case kGlobals[] = {
    {"{{ range(3)|list }}{{ range(1, 4)|list }}{{ range(10, 0, -3)|list }}{{ range(0)|list }}{{ range(5)[::-1] }}",
     "{}", "[0, 1, 2][1, 2, 3][10, 7, 4, 1][]range(4, -1, -1)"},
    {"{% set ns = namespace(a=1) %}{% set ns.b = ns.a + 1 %}{{ ns.a }}{{ ns.b }}{{ namespace({'x': 2}).x }}{{ "
     "dict(a=1, b=2) }}{{ dict([('k', 'v')]) }}",
     "{}", "122{'a': 1, 'b': 2}{'k': 'v'}"},
    {"{{ strftime_now('%d %b %Y') }}|{{ strftime_now('%Y-%m-%dT%H:%M:%S') }}|{{ strftime_now('%A %B %-d') }}|{{ "
     "strftime_now('%z%Z') }}",
     "{}", "10 Jun 2024|2024-06-10T06:13:20|Monday June 10|"},
};
// Generation
const Case kGeneration[] = {
    {"{% for m in messages %}<{{ m.role }}>{% if m.role == 'assistant' %}{% generation %}{{ m.content }}</s>{% "
     "endgeneration %}{% else %}{{ m.content }}{% endif %}{% endfor %}",
     "{\"messages\": [{\"role\": \"system\", \"content\": \"Sys\"}, {\"role\": \"user\", \"content\": \"Hi\"}, "
     "{\"role\": \"assistant\", \"content\": \"Yo\"}]}",
     "<system>Sys<user>Hi<assistant>Yo</s>"},
};

}  // namespace

TEST_CASE("whitespace control: trim_blocks, lstrip_blocks, - and +, comments, raw") {
  check_cases(kWhitespace);
}
TEST_CASE("literals: strings and escapes, numbers, constants, lists, tuples, dicts") {
  check_cases(kLiterals);
}
TEST_CASE("operators follow Python and jinja2 precedence") {
  check_cases(kOperators);
}
TEST_CASE("printing is Python's str(): repr of containers, floats, None, True") {
  check_cases(kPrinting);
}
TEST_CASE("attribute, item and slice access with the sandbox's fallbacks") {
  check_cases(kAccess);
}
TEST_CASE("undefined values print empty, iterate empty, test false") {
  check_cases(kUndefined);
}
TEST_CASE("if, for with loop.*, filters on loops, else, unpacking, break and continue") {
  check_cases(kControl);
}
TEST_CASE("scoping follows jinja2's frames") {
  check_cases(kScoping);
}
TEST_CASE("macros, filter blocks") {
  check_cases(kMacros);
}
TEST_CASE("filters") {
  check_cases(kFilters);
}
TEST_CASE("tests") {
  check_cases(kTests);
}
TEST_CASE("str, list and dict methods") {
  check_cases(kMethods);
}
TEST_CASE("globals: range, namespace, dict, strftime_now") {
  check_cases(kGlobals);
}

TEST_CASE("generation blocks record their spans in bytes and in code points, as transformers") {
  const std::string messages =
      R"({"messages": [{"role": "user", "content": "Hé"}, {"role": "assistant", "content": "Yö😀"},)"
      R"( {"role": "user", "content": "x"}, {"role": "assistant", "content": "ok"}]})";
  using Spans = std::vector<std::pair<size_t, size_t>>;
  SUBCASE("in a loop") {
    const Template::Output out = render_output(
        "{% for m in messages %}<{{ m.role }}>{% if m.role == 'assistant' %}{% generation %}{{ m.content }}</s>"
        "{% endgeneration %}{% else %}{{ m.content }}{% endif %}{% endfor %}",
        messages);
    CHECK(out.text == "<user>Hé<assistant>Yö😀</s><user>x<assistant>ok</s>");
    CHECK(out.generation_char_spans == Spans{{19, 26}, {44, 50}});
    CHECK(out.generation_spans == Spans{{20, 31}, {49, 55}});
    CHECK(out.text.substr(20, 11) == "Yö😀</s>");
  }
  SUBCASE("inside a macro: placed at the output so far, like transformers") {
    const Template::Output out = render_output(
        "{% macro turn(m) %}[{% generation %}{{ m.content }}{% endgeneration %}]{% endmacro %}"
        "{% for m in messages %}{{ m.role }}:{{ turn(m) }};{% endfor %}",
        messages);
    CHECK(out.text == "user:[Hé];assistant:[Yö😀];user:[x];assistant:[ok];");
    CHECK(out.generation_char_spans == Spans{{5, 7}, {20, 23}, {31, 32}, {45, 47}});
  }
  SUBCASE("a frame of its own; empty blocks give empty spans") {
    const Template::Output out = render_output(
        "A{% generation %}{% set x = 1 %}B{{ x }}{% endgeneration %}{{ x }}C{% generation %}{% endgeneration %}");
    CHECK(out.text == "AB1C");
    CHECK(out.generation_char_spans == Spans{{1, 3}, {4, 4}});
    CHECK(out.generation_spans == Spans{{1, 3}, {4, 4}});
  }
  check_cases(kGeneration);
}

TEST_CASE("raise_exception throws TemplateRaise with the template's message") {
  const Template t(
      "{% for m in messages %}{% if (m.role == 'user') != (loop.index0 % 2 == 0) %}"
      "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
      "{% endif %}{{ m.content }}{% endfor %}",
      "alt.jinja");
  CHECK(t.render(Json::parse(R"({"messages": [{"role": "user", "content": "a"}]})")).text == "a");
  try {
    t.render(Json::parse(R"({"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]})"));
    FAIL("no exception");
  } catch (const TemplateRaise& e) {
    CHECK(std::string(e.what()) == "Conversation roles must alternate user/assistant/user/assistant/...");
    CHECK(e.where() == "alt.jinja");
    CHECK(e.line() == 1);
    CHECK(e.code() == fsdp::ExitCode::kBadInput);
  }
  CHECK_THROWS_AS(render("{{ raise_exception(1 ~ 2) }}"), TemplateRaise);
}

TEST_CASE("errors jinja2 raises while rendering name the line") {
  CHECK(error_of("line 1\n{{ nope.attr }}") == "t.jinja:2: 'nope' is undefined");
  CHECK(error_of("{{ nope + 1 }}") == "t.jinja:1: 'nope' is undefined");
  CHECK(error_of("{{ d.x.y }}", R"({"d": {}})") == "t.jinja:1: 'dict object' has no attribute 'x'");
  CHECK(error_of("{{ 1 + 'a' }}") == "t.jinja:1: unsupported operand type(s) for +: 'int' and 'str'");
  CHECK(error_of("{{ 'a' + 1 }}") == "t.jinja:1: can only concatenate str (not \"int\") to str");
  CHECK(error_of("{{ 1 < 'a' }}") == "t.jinja:1: '<' not supported between instances of 'int' and 'str'");
  CHECK(error_of("{{ 1 / 0 }}") == "t.jinja:1: division by zero");
  CHECK(error_of("{% for x in none %}{% endfor %}") == "t.jinja:1: 'NoneType' object is not iterable");
  CHECK(error_of("{{ nope|tojson }}") == "t.jinja:1: Object of type Undefined is not JSON serializable");
  CHECK(error_of("{% for a, b in [1] %}{% endfor %}") == "t.jinja:1: 'int' object is not iterable");
  CHECK(error_of("{% for a, b in [[1, 2, 3]] %}{% endfor %}") == "t.jinja:1: too many values to unpack (expected 2)");
  CHECK(error_of("{% macro f(a) %}{% endmacro %}{{ f(1, 2) }}") ==
        "t.jinja:1: macro 'f' takes not more than 1 argument(s)");
  CHECK(error_of("{% macro f(a) %}{% endmacro %}{{ f(b=1) }}") == "t.jinja:1: macro 'f' takes no keyword argument 'b'");
  CHECK(error_of("{% set x = 1 %}{% set x.a = 2 %}") == "t.jinja:1: cannot assign attribute on non-namespace object");
  CHECK(error_of("{{ 'x'.nope() }}") == "t.jinja:1: 'str object' has no attribute 'nope'");
  CHECK(error_of("{{ [1]|length(2) }}").find("argument") != std::string::npos);
}

TEST_CASE("the sandbox refuses mutation and private attributes") {
  CHECK(render("[{{ messages.append }}]", R"({"messages": []})") == "[]");
  CHECK(error_of("{{ messages.append(1) }}", R"({"messages": []})") ==
        "t.jinja:1: access to attribute 'append' of 'list' object is unsafe.");
  CHECK(error_of("{% set _ = d.update({'a': 1}) %}", R"({"d": {}})") ==
        "t.jinja:1: access to attribute 'update' of 'dict' object is unsafe.");
  CHECK(error_of("{{ d.pop('a') }}", R"({"d": {"a": 1}})") ==
        "t.jinja:1: access to attribute 'pop' of 'dict' object is unsafe.");
  CHECK(error_of("{{ ''.__class__() }}") == "t.jinja:1: access to attribute '__class__' of 'str' object is unsafe.");
  CHECK(error_of("{% set ns = namespace(_x=1) %}").find("underscore-prefixed attributes") != std::string::npos);
  CHECK(error_of("{% set ns = namespace() %}{% set ns._x = 1 %}").find("underscore-prefixed attributes") !=
        std::string::npos);
  CHECK(error_of("{{ range(100001)|length }}").find("MAX_RANGE (100000)") != std::string::npos);
}

TEST_CASE("syntax errors and unsupported constructs are refused when parsed, naming the line") {
  auto parse_error = [](const std::string& src) {
    try {
      Template t(src, "bad.jinja");
    } catch (const fsdp::InputError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK(parse_error("a\n{% include 'x.jinja' %}") == "bad.jinja:2: the 'include' tag is not supported");
  CHECK(parse_error("{% extends 'base' %}") == "bad.jinja:1: the 'extends' tag is not supported");
  CHECK(parse_error("{% import 'm' as m %}") == "bad.jinja:1: the 'import' tag is not supported");
  CHECK(parse_error("{% from 'm' import f %}") == "bad.jinja:1: the 'from' tag is not supported");
  CHECK(parse_error("{% block b %}{% endblock %}") == "bad.jinja:1: the 'block' tag is not supported");
  CHECK(parse_error("{% call f() %}{% endcall %}") == "bad.jinja:1: the 'call' tag is not supported");
  CHECK(parse_error("{% autoescape true %}{% endautoescape %}") ==
        "bad.jinja:1: the 'autoescape' tag is not supported");
  CHECK(parse_error("{% for x in y recursive %}{% endfor %}") == "bad.jinja:1: recursive for loops are not supported");
  CHECK(parse_error("{% do x %}") == "bad.jinja:1: encountered unknown tag 'do'");
  CHECK(parse_error("\n\n{{ x|nofilter }}") == "bad.jinja:3: no filter named 'nofilter'");
  CHECK(parse_error("{{ x|groupby('a') }}") == "bad.jinja:1: the filter 'groupby' is not supported");
  CHECK(parse_error("{{ x is notatest }}") == "bad.jinja:1: no test named 'notatest'");
  CHECK(parse_error("{{ f(*args) }}") == "bad.jinja:1: *args and **kwargs in calls are not supported");
  CHECK(parse_error("{{ café }}") == "bad.jinja:1: non-ASCII names are not supported");
  CHECK(parse_error("{% break %}") == "bad.jinja:1: 'break' outside of a for loop");
  CHECK(parse_error("{% for x in y %}") ==
        "bad.jinja:1: unexpected end of template; jinja was looking for the following tags: 'endfor' or 'else'");
  CHECK(parse_error("{{ x ") == "bad.jinja:1: unexpected end of template, expected '}}'");
  CHECK(parse_error("{# open") == "bad.jinja:1: Missing end of comment tag");
  CHECK(parse_error("{{ (1 }}") == "bad.jinja:1: unexpected '}', expected ')'");
  CHECK(parse_error("{{ 'unterminated }}") == "bad.jinja:1: unexpected char \"'\" at 3");
  CHECK(parse_error("{% set true = 1 %}") == "bad.jinja:1: can't assign to 'const'");
  CHECK(parse_error("{% macro f(a=1, b) %}{% endmacro %}") ==
        "bad.jinja:1: non-default argument follows default argument");
  CHECK(parse_error("{{ 99999999999999999999 }}") ==
        "bad.jinja:1: integer 99999999999999999999 does not fit 64 bits (not supported)");
  CHECK(parse_error(std::string("{{ '\xff' }}")) == "bad.jinja:1: the template is not valid UTF-8 (byte 4)");
}

TEST_CASE("inside if and conditional expressions unknown filters fail only when they run, as in jinja2") {
  const std::string src = "{% if x %}{{ y|from_json }}{% endif %}{{ y|upper if x else 'plain' }}";
  CHECK(render(src, R"({"x": false, "y": "a"})") == "plain");
  CHECK(error_of(src, R"({"x": true, "y": "a"})") == "t.jinja:1: No filter named 'from_json' found.");
  CHECK(render("{% if false %}{{ x|truncate(3) }}{% endif %}ok") == "ok");
  CHECK(error_of("{% if true %}{{ 'abc'|truncate(3) }}{% endif %}") ==
        "t.jinja:1: the filter 'truncate' is not supported");
}

TEST_CASE("what the engine does not implement is refused at run time, never approximated") {
  CHECK(error_of("{{ 'x'.casefold() }}") == "t.jinja:1: str.casefold() is not supported");
  CHECK(error_of("{{ 'Σ'.lower() }}").find("GREEK CAPITAL SIGMA") != std::string::npos);
  CHECK(error_of("{{ 'é'.isalpha() }}") == "t.jinja:1: str.isalpha() on non-ASCII text is not supported");
  CHECK(error_of("{{ '{:>4}'.format(1) }}") == "t.jinja:1: format specs in str.format ('{:>4}') are not supported");
  CHECK(error_of("{{ '%x' % 255 }}") == "t.jinja:1: printf-style conversion '%x' is not supported");
  CHECK(error_of("{{ 2 ** 63 }}") == "t.jinja:1: integer overflow (Python integers are unbounded; not supported)");
  CHECK(error_of("{{ [1]|map('upper') }}") ==
        "t.jinja:1: cannot print a generator (Python prints its address): add |list");
  CHECK(error_of("{{ 'a'.upper }}") ==
        "t.jinja:1: cannot print a builtin_function_or_method (Python prints its address)");
  CHECK(error_of("{{ ('x'|safe).strip() }}") == "t.jinja:1: methods of |safe or |escape strings are not supported");
  CHECK(error_of("{{ cycler('a') }}") == "t.jinja:1: cycler() is not supported");
  CHECK(error_of("{{ (1).real }}") == "t.jinja:1: the attribute 'real' of numbers is not supported");
  CHECK(error_of("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}") ==
        "t.jinja:1: macro calls nest deeper than 200, the limit for a template (set data.chat_template_max_depth higher "
          "to allow more)");
  // jinja2 renders the loop variable of such a macro as "missing".
  CHECK(error_of("{% set ns = namespace() %}{% for i in [1] %}{% macro m() %}{{ i }}{% endmacro %}{% set ns.m = m %}"
                 "{% endfor %}{{ ns.m() }}") ==
        "t.jinja:1: calling macro 'm' after the block that defined it ended is not supported");
}

TEST_CASE("generators are true, have no length and are used up, as in Python") {
  CHECK(render("{% set g = [1, 2]|map('string') %}{{ g|list }}{{ g|list }}") == "['1', '2'][]");
  CHECK(render("{% if []|select %}always{% endif %}") == "always");
  CHECK(error_of("{{ [1]|select|length }}") == "t.jinja:1: object of type 'generator' has no len()");
  CHECK(render("{% set g = [1, 2, 3]|select %}{{ g|first }}{{ g|list }}") == "1[2, 3]");
}

TEST_CASE("variables: JSON in, Python types out") {
  CHECK(render(
            "{{ i }} {{ f }} {{ g }} {{ b }} {{ n }} {{ s }} {{ l }} {{ d }}",
            R"({"i": 7, "f": 1.0, "g": 1e-7, "b": true, "n": null, "s": "x", "l": [1, "a"], "d": {"z": 1, "a": 2}})") ==
        "7 1.0 1e-07 True None x [1, 'a'] {'z': 1, 'a': 2}");
  CHECK(render("{{ d|tojson }}", R"({"d": {"z": 1, "a": [2.5, "é"]}})") == R"({"z": 1, "a": [2.5, "é"]})");
  CHECK_THROWS_AS(Template("x", "t").render(Json::array()), fsdp::InputError);
  CHECK(error_of("{{ big }}", R"({"big": 18446744073709551615})") ==
        "t.jinja:1: integer 18446744073709551615 does not fit 64 bits (not supported)");
  CHECK(Template("{{ x }}", "t").where() == "t");
}

TEST_CASE("render is const and thread-safe") {
  const Template t(
      "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
      "{{ m.content|upper }}{% endfor %}{{ ns.n }}{{ [1, 2]|map('string')|join }}",
      "threads.jinja");
  const Json vars = Json::parse(R"({"messages": [{"content": "a"}, {"content": "b"}]})");
  std::vector<std::thread> threads;
  std::vector<int> ok(4, 0);
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      for (int k = 0; k < 500; ++k) ok[i] += t.render(vars, kNow).text == "AB212";
    });
  }
  for (std::thread& th : threads) th.join();
  for (int n : ok) CHECK(n == 500);
}
