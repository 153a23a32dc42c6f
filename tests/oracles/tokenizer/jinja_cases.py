"""Chat templates that exercise pagellm's Jinja interpreter, compared with transformers'
apply_chat_template(chat_template=...). Each case is (name, template, request); the request
is what pagellm's chat-template command reads ({"messages": ..., other variables...}).

Cases marked as errors are expected to fail in both (for example raise_exception).
"""

MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi ünï 你好"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "Bye"},
]
ALTERNATING = MESSAGES[1:]
TOOLS = [{"type": "function", "function": {"name": "f", "description": "é \"q\"\n", "parameters": {
    "type": "object", "properties": {"x": {"type": "number", "default": 1.5}, "y": {"type": "array"}}}}}]

TOOL_MESSAGES = [
    {"role": "system", "content": "You write code."},
    {"role": "user", "content": "Weather in Paris and a search, please."},
    {"role": "assistant", "content": "  Checking.  ", "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2], "opts": {"unit": "C"}}}},
        {"name": "search", "arguments": {"query": "café ünï", "limit": 3, "exact": False, "score": 0.5}}]},
    {"role": "tool", "content": "{\"temp\": 21}"},
    {"role": "tool", "content": "no results"},
    {"role": "assistant", "content": "Done."},
]
CODER_TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "  Weather for a city.  ",
                                      "parameters": {"type": "object", "required": ["city"], "properties": {
                                          "city": {"type": "string", "description": "City name", "minLength": 1},
                                          "days": {"type": "array", "items": {"type": "integer"}},
                                          "opts": {"type": "object", "x-extra": None}}}}},
    {"name": "search", "parameters": {"type": "object", "properties": {"query": {"type": "string"}}}, "strict": True},
]

# Exercises what Qwen3-Coder-style templates use: a recursive-looking macro over mappings
# with a filtered loop, `is mapping` / `is sequence and is not string`, |items, tojson|safe
# inside a conditional expression, loop.previtem / loop.nextitem, reassigning a loop
# variable, and shadowing a template variable at the top level.
CODER_LIKE = """{% macro extra_keys(d, handled) %}
    {%- if d is mapping %}
        {%- for key in d if key not in handled %}
            {%- if d[key] is mapping or (d[key] is sequence and d[key] is not string) %}
                {{- '\\n<' ~ key ~ '>' ~ (d[key] | tojson | safe) ~ '</' ~ key ~ '>' }}
            {%- else %}
                {{- '\\n<' ~ key ~ '>' ~ (d[key] | string) ~ '</' ~ key ~ '>' }}
            {%- endif %}
        {%- endfor %}
    {%- endif %}
{% endmacro %}
{%- if messages[0]["role"] == "system" %}
    {%- set system_message = messages[0]["content"] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}
{%- if not tools is defined or tools is none %}
    {%- set tools = [] %}
{%- endif %}
{%- if system_message is defined %}{{- "<|im_start|>system\\n" + system_message }}{%- endif %}
{%- if tools is iterable and tools | length > 0 %}
    {{- "\\n<tools>" }}
    {%- for tool in tools %}
        {%- if tool.function is defined %}{%- set tool = tool.function %}{%- endif %}
        {{- "\\n<function>\\n<name>" ~ tool.name ~ "</name>" }}
        {%- if tool.description is defined %}{{- '\\n<description>' ~ (tool.description | trim) ~ '</description>' }}{%- endif %}
        {%- if tool.parameters is defined and tool.parameters is mapping and tool.parameters.properties is mapping %}
            {%- for name, fields in tool.parameters.properties|items %}
                {{- '\\n<parameter>\\n<name>' ~ name ~ '</name>' }}
                {%- if fields.type is defined %}{{- '\\n<type>' ~ (fields.type | string) ~ '</type>' }}{%- endif %}
                {{- extra_keys(fields, ['name', 'type', 'description']) }}
                {{- '\\n</parameter>' }}
            {%- endfor %}
        {%- endif %}
        {{- extra_keys(tool.parameters, ['type', 'properties']) }}
        {{- extra_keys(tool, ['type', 'name', 'description', 'parameters']) }}
        {{- '\\n</function>' }}
    {%- endfor %}
    {{- "\\n</tools>" }}
{%- endif %}
{%- if system_message is defined %}{{- '<|im_end|>\\n' }}{%- endif %}
{%- for message in loop_messages %}
    {%- if message.role == "assistant" and message.tool_calls is defined and message.tool_calls | length > 0 %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content is string and message.content | trim | length > 0 %}
            {{- '\\n' + message.content | trim + '\\n' }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}
            {{- '\\n<tool_call>\\n<function=' + tool_call.name + '>\\n' }}
            {%- for args_name, args_value in tool_call.arguments|items %}
                {{- '<parameter=' + args_name + '>\\n' }}
                {%- set args_value = args_value | tojson | safe if args_value is mapping or (args_value is sequence and args_value is not string) else args_value | string %}
                {{- args_value }}
                {{- '\\n</parameter>\\n' }}
            {%- endfor %}
            {{- '</function>\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.previtem and loop.previtem.role != "tool" %}{{- '<|im_start|>user\\n' }}{%- endif %}
        {{- '<tool_response>\\n' ~ message.content ~ '\\n</tool_response>\\n' }}
        {%- if not loop.last and loop.nextitem.role != "tool" %}{{- '<|im_end|>\\n' }}{%- elif loop.last %}{{- '<|im_end|>\\n' }}{%- endif %}
    {%- else %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
"""

CASES = [
    ("whitespace_loop", "{% for m in messages %}\n  {{ m.role }}: {{ m.content }}\n{% endfor %}", {}),
    ("strip_markers", "  {%- if true %}\n  yes\n  {% endif -%}\n  end", {}),
    ("lstrip_plus_and_comments", "{%+ if true %}x{% endif %}\n{# comment #}\n  {# indented comment #}\nafter", {}),
    ("variable_strip", "a  {{- ' b ' -}}  c\n{{ 'd' }}  \n", {}),
    ("raw_block", "{% raw %}{{ not rendered }} {% if %}{% endraw %}x\n  {%- raw -%}  y  {%- endraw %}z", {}),
    ("loop_variables", "{% for m in messages %}{{ loop.index }}/{{ loop.length }} {{ loop.first }} {{ loop.last }} "
     "{{ loop.revindex }} {{ loop.revindex0 }} {{ loop.previtem.role if loop.previtem is defined else '-' }} "
     "{{ loop.nextitem.role if loop.nextitem is defined else '-' }}|{% endfor %}", {}),
    ("for_filter_else", "{% for m in messages if m.role == 'user' %}{{ m.content }}({{ loop.index }}/{{ loop.length }});"
     "{% else %}none{% endfor %}|{% for x in [] %}x{% else %}empty{% endfor %}", {}),
    ("break_continue", "{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i > 5 %}{% break %}"
     "{% endif %}{{ i }}{% endfor %}", {}),
    ("namespace", "{% set ns = namespace(count=0, names=[]) %}{% for m in messages %}{% set ns.count = ns.count + 1 %}"
     "{% set ns.names = ns.names + [m.role] %}{% endfor %}{{ ns.count }} {{ ns.names }}", {}),
    ("scoping", "{% set x = 1 %}{% for m in messages %}{% if loop.index > 2 %}{% set x = loop.index %}{% endif %}"
     "{{ x }}{% endfor %}{{ x }}{% if true %}{% set y = 5 %}{% endif %}{{ y }}", {}),
    ("unpacking_items", "{% for k, v in {'a': 1, 'b': [1, 2], 'c': {'d': none}}.items() %}{{ k }}={{ v }};{% endfor %}"
     "{% for k, v in messages[0]|items %}{{ k }}:{{ v }} {% endfor %}{% for (a, b) in [(1, 2), [3, 4]] %}{{ a + b }}{% endfor %}", {}),
    ("tojson", "{{ tools | tojson }}\n{{ tools | tojson(indent=2) }}\n{{ {'b': 1, 'a': [1.5, 'é\"\\n', none, true]} | "
     "tojson(sort_keys=true) }}\n{{ 'ü😀\\u2028' | tojson(ensure_ascii=true) }}\n{{ [1, {'a': []}, {}] | tojson(indent='\\t') }}\n"
     "{{ {'a': 1} | tojson(separators=(',', ':')) }}", {"tools": TOOLS}),
    ("string_methods", "{% set s = '  Hello, World! Hello  ' %}{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|"
     "{{ s.strip(' H!o') }}|{{ s.split() }}|{{ s.split(',') }}|{{ s.split('l', 2) }}|{{ s.rsplit('l', 1) }}|"
     "{{ s.upper() }}|{{ s.lower() }}|{{ s.title() }}|{{ s.replace('Hello', 'Bye', 1) }}|{{ s.find('World') }}|"
     "{{ s.rfind('l') }}|{{ s.count('l') }}|{{ s.startswith('  He') }}|{{ s.endswith(('x', '  ')) }}|"
     "{{ 'ÉCOLE straße'.lower() }}|{{ 'éa'.upper() }}|{{ 'hello world'.capitalize() }}|{{ 'a,b,,c'.split(',') }}|"
     "{{ '  a  b  '.split(none, 1) }}|{{ '  a  b  '.rsplit(none, 1) }}|{{ ' a b '.split(none, 0) }}|{{ 'x'.join(['1', '2', '3']) }}|{{ 'abc'.replace('', '-') }}", {}),
    ("slicing", "{{ messages[::-1] | map(attribute='role') | join(',') }}|{{ messages[1:3] | length }}|{{ 'abcdef'[::2] }}|"
     "{{ 'héllo'[1:-1] }}|{{ [1,2,3,4,5][-2:] }}|{{ [1,2,3][5:] }}|{{ 'abc'[-1] }}|{{ messages[-1].content }}|"
     "{{ [1,2,3,4,5][4:1:-2] }}|{{ 'abc'[10] is defined }}|{{ messages.0.role }}", {}),
    ("filters", "{{ [3,1,2]|sort }}|{{ ['b','A','c']|sort }}|{{ ['b','A','c']|sort(case_sensitive=true) }}|"
     "{{ [3,1,2]|sort(reverse=true) }}|{{ messages|map(attribute='role')|unique|list }}|{{ [1,2,3]|sum }}|"
     "{{ [1,2,3]|min }}|{{ [1,2,3]|max }}|{{ 'x'|default('d') }}|{{ undefined_var|default('d') }}|"
     "{{ ''|default('d', true) }}|{{ [1,2]|first }}|{{ [1,2]|last }}|{{ 'abc'|reverse }}|{{ [1,2]|reverse|list }}|"
     "{{ 'a b c'|wordcount }}|{{ -3|abs }}|{{ 2.5|round }}|{{ 3.5|round }}|{{ 3.14159|round(2) }}|"
     "{{ 2.7|round(method='floor') }}|{{ 2.1|round(method='ceil') }}|{{ messages|sort(attribute='role')|map(attribute='content')|join('/') }}|"
     "{{ 'hello world-wide (x)'|title }}|{{ '  x  '|trim }}|{{ 'xxaxx'|trim('x') }}|{{ 'abc'|upper }}|"
     "{{ 'a-b-c'|replace('-', '+') }}|{{ 'ab'|center(6) }}|[{{ 'abc'|center(8) }}]|{{ 'ABC'|lower }}|{{ 'hello'|capitalize }}|"
     "{{ [1, 2, 3]|join }}|{{ messages|join(', ', attribute='role') }}|{{ 'abc'|list }}|{{ {'a': 1}|list }}|"
     "{{ ['a', 'b']|map('upper')|list }}|{{ {'b': 1, 'a': 2}|dictsort }}|{{ {'b': 1, 'a': 2}|dictsort(by='value') }}|"
     "{{ '<a href=\"x\">'|e }}|{{ '<b>'|safe }}", {}),
    ("select_reject", "{{ messages|selectattr('role', 'equalto', 'user')|map(attribute='content')|list }}|"
     "{{ messages|rejectattr('role', 'eq', 'user')|list|length }}|{{ [0,1,2,none,'',3]|select|list }}|"
     "{{ [1,2,3,4]|select('odd')|list }}|{{ [1,2,3,4]|reject('even')|list }}|"
     "{{ messages|selectattr('name', 'defined')|list|length }}|{{ messages|selectattr('role', 'in', ['user', 'system'])|list|length }}|"
     "{{ [1, 5, 10]|select('gt', 3)|list }}|{{ messages|map(attribute='name', default='anon')|list }}", {}),
    ("tests", "{{ none is none }} {{ 1 is number }} {{ 1.0 is float }} {{ 1 is integer }} {{ true is boolean }} "
     "{{ 'a' is string }} {{ {} is mapping }} {{ [] is sequence }} {{ x is undefined }} {{ 3 is odd }} {{ 4 is even }} "
     "{{ 9 is divisibleby 3 }} {{ 'a' is in 'abc' }} {{ 'abc' is lower }} {{ true is true }} {{ false is false }} "
     "{{ messages is iterable }} {{ 'A' is upper }} {{ true is number }} {{ true is integer }} {{ 1 is eq 1.0 }} "
     "{{ 2 is gt 1 }} {{ 'x' is ne 'y' }} {{ messages is mapping }} {{ messages[0] is mapping }} {{ none is defined }} "
     "{{ 'a' is not none }} {{ not x is defined }}", {}),
    ("arithmetic", "{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 1 + 2 * 3 }} "
     "{{ (1 + 2) * 3 }} {{ 'ab' * 3 }} {{ [1] * 2 }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 'a' < 'b' }} {{ 1 == 1.0 }} "
     "{{ true == 1 }} {{ 'a' ~ 1 ~ none }} {{ 1.5 + 1 }} {{ 10 / 4 }} {{ 1e20 }} {{ 0.1 + 0.2 }} {{ -0.0 }} {{ 1e-7 }} "
     "{{ 123456789012345678 }} {{ 7.5 // 2 }} {{ -7.5 % 2 }} {{ 2 ** -1 }} {{ -1 ** 2 }} {{ 2 * 3 ~ 4 }} {{ (1 + 2) ~ 3 }} "
     "{{ 1_000 + 0x10 }} {{ 100000000000000000.0 }} {{ 1/3 }} {{ 2.0 * 3 }} {{ 10 - 2.5 }} {{ -(3) }} {{ +4 }}", {}),
    ("conditional_and_or", "{{ 'yes' if messages else 'no' }} [{{ 'a' if false }}] {{ 0 or 'x' }} {{ 1 and 'y' }} "
     "{{ none or [] }} {{ not none }} {{ not 'x' }} {{ 'b' in ['a','b'] }} {{ 'z' not in 'abc' }} {{ 'role' in messages[0] }} "
     "{{ 'a' if 0 else 'b' if 1 else 'c' }} {{ [] or {} or 0 }} {{ 'x' in undefined_thing }}", {}),
    ("macros", "{% macro render(m, prefix='> ') %}{{ prefix }}{{ m.role|upper }}: {{ m.content }}\n{% endmacro %}"
     "{% for m in messages %}{{ render(m) }}{{ render(m, prefix='* ') }}{{ render(prefix='# ', m=m) }}{% endfor %}"
     "{% macro noargs() -%}  [none]  {%- endmacro %}{{ noargs() }}{{ noargs() | length }}", {}),
    ("set_block", "{% set header %}Role list: {% for m in messages %}{{ m.role }} {% endfor %}{% endset %}[{{ header|trim }}]"
     "{%- set inner -%}\n   padded   \n{%- endset %}[{{ inner }}]", {}),
    ("with", "{% with a = 1, b = 'two' %}{{ a }}{{ b }}{% endwith %}{{ a is defined }}{% with %}{{ messages|length }}{% endwith %}", {}),
    ("dict_methods", "{% set d = {'x': 1, 'y': none} %}{{ d.get('x') }} {{ d.get('z', 'dflt') }} {{ d.get('z') }} "
     "{{ d.keys()|list }} {{ d.values()|list }} {{ d['x'] }} {{ d.x }} {{ d.y is none }} {{ d.z is defined }} "
     "{{ d.items()|list }} {{ d|length }} {{ d }}", {}),
    ("repr", "{{ messages[0] }}|{{ [1, 'a', none, true, 1.5, {'k': 'v'}] }}|{{ ('a',) }}|{{ (1, 2) }}|{{ \"it's\" }}|"
     "{{ ['it\\'s', 'say \"hi\"', 'both \\' \"', 'tab\\there', 'nl\\nx', 'é', '\\u00a0', '\\x7f', '😀', '\\u200b'] }}|"
     "{{ [1e16, 1e15, 0.0001, 0.00001, -2.5, 3.0] }}|{{ true }}|{{ none }}|{{ namespace(a=1) }}", {}),
    ("string_escapes", "{{ 'a\\tb\\nc\\\\d\\'e\"f' }}|{{ \"\\u00e9\\x41\\101\" }}|{{ 'unknown \\d escape' }}|{{ \"adjacent\" 'strings' }}|"
     "{{ '\\U0001F600' }}", {}),
    ("raise_ok", "{% if messages|length > 100 %}{{ raise_exception('too many') }}{% endif %}ok", {}),
    ("raise_error", "{{ raise_exception('Conversation roles must alternate') }}", {"error": True}),
    ("undefined_attribute_error", "{{ messages[0].missing.deeper }}", {"error": True}),
    ("undefined_plus_error", "{{ undefined_name + 'x' }}", {"error": True}),
    ("type_error", "{{ 'a' + 1 }}", {"error": True}),
    ("loop_cycle", "{% for m in messages %}{{ loop.cycle('odd', 'even') }} {% endfor %}", {}),
    ("indent_filter", "{{ 'line1\\nline2\\n\\nline4' | indent(2) }}|{{ 'a\\nb' | indent(4, first=true) }}|"
     "{{ 'a\\n\\nb'|indent(2, blank=true) }}|{{ 'x\\ny'|indent('--') }}", {}),
    ("nested_loops", "{% for m in messages %}{% for c in m.content[:3] %}{{ loop.index0 }}{{ c }}{% endfor %}/{{ loop.index }} "
     "{% endfor %}", {}),
    ("generation_tag", "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{% endgeneration %}"
     "{% else %}{{ m.content }}{% endif %}\n{% endfor %}", {}),
    ("builtin_variables", "{{ eos_token }}|{{ pad_token }}|{{ bos_token is defined }}|{{ add_generation_prompt }}|{{ tools }}|"
     "{{ documents }}|{{ unk_token is defined }}", {"add_generation_prompt": True}),
    ("custom_variables", "{{ custom_var }} {{ flag }} {{ custom_var[1].a }} {{ eos_token }}",
     {"custom_var": [1, {"a": "b"}], "flag": False, "eos_token": "OVERRIDE"}),
    ("conversions", "{{ '42'|int + 1 }} {{ '3.5'|float }} {{ 'x'|int }} {{ 'x'|int(7) }} {{ 3.9|int }} {{ 42|string ~ '!' }} "
     "{{ '1A'|int(0, 16) }} {{ true|int }} {{ ' 12 '|int }} {{ '2.5'|int }} {{ none|string }} {{ 5|float }}", {}),
    ("string_predicates", "{{ '123'.isdigit() }} {{ 'abc'.isalpha() }} {{ 'ABC'.isupper() }} {{ 'abc'.islower() }} "
     "{{ '  '.isspace() }} {{ 'a1'.isalnum() }} {{ ''.isdigit() }} {{ 'A1b'.isupper() }} {{ '1'.isupper() }}", {}),
    ("string_misc", "{{ ','.join(['a','b']) }} {{ 'a\\nb\\r\\nc'.splitlines() }} {{ 'abc'.zfill(5) }} {{ '-7'.zfill(4) }} "
     "{{ 'test.py'.removesuffix('.py') }} {{ 'x-y'.split('-')[-1] }} {{ 'abcabc'.index('c') }} {{ 'aXbXc'.rsplit('X') }} "
     "{{ 'a b'.split(' ') }} {{ 'abc'.find('z') }} {{ 'abcabc'.find('c', 3) }} {{ 'abc'.startswith('b', 1) }}", {}),
    ("chatml", "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
     "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}", {"add_generation_prompt": True}),
    ("mistral_like", "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
     "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
     "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
     "{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}"
     "{% endfor %}", {"messages": ALTERNATING}),
    ("mistral_like_error", "{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
     "{{ raise_exception('Conversation roles must alternate') }}{% endif %}{{ message['content'] }}{% endfor %}", {"error": True}),
    ("comments_strip", "{#- comment -#}  x  {#- c2 #}\ny {#+ keep #}\n z", {}),
    ("tabs_lstrip", "\t{% if true %}\n\tX\n\t{% endif %}\n  \t{% for i in [1] %}\n{{ i }}\n  {% endfor %}\nend", {}),
    ("crlf_template", "{% if true %}\r\nA\r\n{% endif %}\r\nB\rC\r\n", {}),
    ("trailing_newline", "line\n", {}),
    ("unicode_literals", "{{ '→ ' + messages[1].content }} ✓ {{ '中文' | length }}", {}),
    ("list_compare", "{{ [1,2] == [1,2] }} {{ [1,2] < [1,3] }} {{ {'a':1} == {'a':1} }} {{ (1,2) == [1,2] }} {{ 'a' != 'a' }}", {}),
    ("range_dict", "{{ range(3)|list }} {{ range(1, 10, 3)|list }} {{ range(5, 0, -2)|list }} {{ dict(a=1, b='x') }} "
     "{{ dict(a=1).a }}", {}),
    ("lengths", "{{ messages|length }}{{ messages|count }}{{ 'héllo'|length }}{{ {}|length }}{{ undefined_thing|length }}", {}),
    ("empty_messages_qwen_like", "{%- if messages[0].role == 'system' %}sys{%- endif %}", {"messages": [], "error": True}),
    ("multiline_tags", "{%\n  set x = [\n    1,\n    2,\n  ]\n%}{{\n  x\n  | length\n}}\n{%- for i in x\n  if i > 1 -%}\n[{{ i }}]\n{%- endfor %}", {}),
    ("nested_data", "{% for t in tools %}{{ t.function.name }}({% for k, v in t.function.parameters.properties|items %}"
     "{{ k }}: {{ v.type }}{{ ', ' if not loop.last }}{% endfor %}){% endfor %} {{ tools[0]['function']['parameters']['properties']['x']['default'] }}",
     {"tools": TOOLS}),
    ("none_vs_missing", "{% for m in messages %}{{ m.content is defined }}{{ m.name is defined }}{{ m.get('name', 'n/a') }} {% endfor %}",
     {"messages": [{"role": "user", "content": None, "name": None}, {"role": "assistant", "content": "x", "name": "bot"}]}),
    ("reasoning_alias", "{% for m in messages %}{{ m.reasoning_content }}|{{ m.thinking }}|{{ m|tojson }}\n{% endfor %}",
     {"messages": [{"role": "assistant", "content": "a", "reasoning": "r1"},
                   {"role": "assistant", "thinking": "t2", "content": "b"},
                   {"role": "assistant", "content": "c", "reasoning_content": "rc3", "thinking": "t3"}]}),
    ("boolean_context", "{% if messages[0].content %}A{% endif %}{% if not [] %}B{% endif %}{% if {} %}C{% else %}D{% endif %}"
     "{% if 0.0 %}E{% elif '0' %}F{% endif %}{% if none %}G{% elif undefined_x %}H{% else %}I{% endif %}", {}),
    ("coder_like", CODER_LIKE, {"messages": TOOL_MESSAGES, "tools": CODER_TOOLS, "add_generation_prompt": True}),
    ("coder_like_no_tools", CODER_LIKE, {"messages": TOOL_MESSAGES[1:3]}),
    ("loop_over_string_dict", "{% for c in 'héllo' %}[{{ c }}]{% endfor %}{% for k in {'b': 1, 'a': 2} %}{{ k }}{% endfor %}"
     "{% for x in undefined_x %}never{% else %}empty{% endfor %}", {}),
]
