"""Chat templates written for the tests in the shape of each family's tool-calling templates:
where the tools go, how an assistant's calls and the results are written. They are not the
models' own templates; transformers' renderer is the reference they are rendered against."""

# Qwen2.5 / Hermes: tools in a system turn as <tools> JSON lines, calls as <tool_call>
# blocks, results grouped in a user turn as <tool_response> blocks.
HERMES = r"""
{%- if tools %}
{{- '<|im_start|>system\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content + '\n\n' }}{%- endif %}
{{- '# Tools\n\nSignatures inside <tools></tools>:\n<tools>' }}
{%- for tool in tools %}{{- '\n' + (tool | tojson) }}{%- endfor %}
{{- '\n</tools>\n\nWrite each call as <tool_call>\n{"name": <name>, "arguments": <args>}\n</tool_call><|im_end|>\n' }}
{%- elif messages[0].role == 'system' %}
{{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}
{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
{%- elif message.role == 'assistant' %}
{{- '<|im_start|>assistant' }}
{%- if message.content %}{{- '\n' + message.content }}{%- endif %}
{%- for call in message.tool_calls or [] %}
{{- '\n<tool_call>\n{"name": "' + call.function.name + '", "arguments": ' + (call.function.arguments | tojson) + '}\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\n' }}
{%- elif message.role == 'tool' %}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
{{- '\n<tool_response>\n' + message.content + '\n</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\n' }}{%- endif %}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}
"""
HERMES_SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]

# Llama 3.1: the tools as JSON in the first user turn, a call as the whole reply with
# "parameters", results in an ipython turn.
LLAMA3 = r"""
{{- bos_token }}
{%- if messages[0].role == 'system' %}{%- set system = messages[0].content %}{%- set rest = messages[1:] %}
{%- else %}{%- set system = '' %}{%- set rest = messages %}{%- endif %}
{{- '<|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\n' + system + '<|eot_id|>' }}
{%- for message in rest %}
{%- if message.role == 'user' and loop.first and tools %}
{{- '<|start_header_id|>user<|end_header_id|>\n\nAnswer with a function call as {"name": function name, "parameters": arguments}, or in words.\n\n' }}
{%- for tool in tools %}{{- (tool | tojson(indent=4)) + '\n\n' }}{%- endfor %}
{{- message.content + '<|eot_id|>' }}
{%- elif message.role == 'assistant' and message.tool_calls %}
{%- set call = message.tool_calls[0].function %}
{{- '<|start_header_id|>assistant<|end_header_id|>\n\n{"name": "' + call.name + '", "parameters": ' + (call.arguments | tojson) + '}<|eot_id|>' }}
{%- elif message.role == 'tool' %}
{{- '<|start_header_id|>ipython<|end_header_id|>\n\n' + message.content + '<|eot_id|>' }}
{%- else %}
{{- '<|start_header_id|>' + message.role + '<|end_header_id|>\n\n' + message.content + '<|eot_id|>' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{%- endif %}
"""
LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                   "<|eot_id|>", "<|eom_id|>", "<|python_tag|>"]

# Phi-4-mini: the tools as JSON text in the system message's "tools", calls in the text.
PHI4 = r"""
{%- for message in messages %}
{%- if message.role == 'system' and 'tools' in message and message.tools is not none %}
{{- '<|system|>' + message.content + '<|tool|>' + message.tools + '<|/tool|><|end|>' }}
{%- else %}
{{- '<|' + message.role + '|>' + message.content + '<|end|>' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|assistant|>' }}{%- endif %}
"""
PHI4_SPECIALS = ["<|system|>", "<|user|>", "<|assistant|>", "<|tool|>", "<|/tool|>", "<|tool_call|>",
                 "<|/tool_call|>", "<|end|>", "<|endoftext|>"]

# Granite 3: an available_tools turn, calls as a JSON list after <|tool_call|>, results in a
# tool_response turn.
GRANITE = r"""
{%- if tools %}
{{- '<|start_of_role|>available_tools<|end_of_role|>\n' + (tools | tojson(indent=4)) + '<|end_of_text|>\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'assistant' and message.tool_calls %}
{{- '<|start_of_role|>assistant<|end_of_role|>' + message.content + '<|tool_call|>' + (message.tool_calls | map(attribute='function') | list | tojson) + '<|end_of_text|>\n' }}
{%- elif message.role == 'tool' %}
{{- '<|start_of_role|>tool_response<|end_of_role|>' + message.content + '<|end_of_text|>\n' }}
{%- else %}
{{- '<|start_of_role|>' + message.role + '<|end_of_role|>' + message.content + '<|end_of_text|>\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|start_of_role|>assistant<|end_of_role|>' }}{%- endif %}
"""
GRANITE_SPECIALS = ["<|start_of_role|>", "<|end_of_role|>", "<|end_of_text|>", "<|tool_call|>"]

# Mistral (v3 tokenizers): the tools before the last user message, calls after [TOOL_CALLS]
# with their ids, results in [TOOL_RESULTS] with the call's id.
MISTRAL = r"""
{{- bos_token }}
{%- for message in messages %}
{%- if message.role == 'user' %}
{%- if tools and loop.last %}{{- '[AVAILABLE_TOOLS]' + (tools | tojson) + '[/AVAILABLE_TOOLS]' }}{%- endif %}
{{- '[INST]' + message.content + '[/INST]' }}
{%- elif message.role == 'assistant' and message.tool_calls %}
{{- '[TOOL_CALLS][' }}
{%- for call in message.tool_calls %}
{{- '{"name": "' + call.function.name + '", "arguments": ' + (call.function.arguments | tojson) + ', "id": "' + call.id + '"}' }}
{%- if not loop.last %}{{- ', ' }}{%- endif %}
{%- endfor %}
{{- ']' + eos_token }}
{%- elif message.role == 'tool' %}
{{- '[TOOL_RESULTS]{"content": ' + (message.content | tojson) + ', "call_id": "' + message.tool_call_id + '"}[/TOOL_RESULTS]' }}
{%- elif message.role == 'assistant' %}
{{- message.content + eos_token }}
{%- endif %}
{%- endfor %}
"""
MISTRAL_SPECIALS = ["<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_CALLS]",
                    "[TOOL_RESULTS]", "[/TOOL_RESULTS]"]

FAMILIES = {
    "hermes": (HERMES, HERMES_SPECIALS),
    "llama3": (LLAMA3, LLAMA3_SPECIALS),
    "phi4": (PHI4, PHI4_SPECIALS),
    "granite": (GRANITE, GRANITE_SPECIALS),
    "mistral": (MISTRAL, MISTRAL_SPECIALS),
}
