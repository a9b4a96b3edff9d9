"""Chat templates for tests."""
from __future__ import annotations

from lucebox.chat_template import DEFAULT_CHAT_TEMPLATE, ChatTemplate

_NO_THINKING = "{{- '<think>\\n\\n</think>\\n\\n' -}}\n    {%- endif -%}"


def thinking_template() -> ChatTemplate:
    """lucebox's default template whose generation prompt opens a think block (``...<think>\\n``)
    unless enable_thinking is False, as Qwen3.5/3.6 templates do (the default closes it empty)."""
    assert _NO_THINKING in DEFAULT_CHAT_TEMPLATE
    return ChatTemplate(DEFAULT_CHAT_TEMPLATE.replace(
        _NO_THINKING, "{{- '<think>\\n\\n</think>\\n\\n' -}}\n    {%- else -%}\n        {{- '<think>\\n' -}}\n    {%- endif -%}"))
