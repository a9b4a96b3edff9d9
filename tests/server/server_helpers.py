"""Helpers of the server tests: a Qwen3.5-style chat template and a `lucebox serve` child process."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# A Qwen3.5-style template (XML tool calls, think block opened in the generation prompt), for
# testing what real Qwen3.5/3.6 GGUFs do with lucebox's tiny synthetic vocabulary.
XML_TEMPLATE = r"""
{%- if tools -%}
<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}

{% endif %}# Tools

You have access to the following functions:

<tools>
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
</tools>

If you choose to call a function ONLY reply in the following format with NO suffix:

<tool_call>
<function=example_function_name>
<parameter=example_parameter_1>
value_1
</parameter>
</function>
</tool_call><|im_end|>
{% elif messages[0].role == 'system' -%}
<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif -%}
{%- for message in messages -%}
{%- if message.role == 'user' or (message.role == 'system' and not loop.first) -%}
<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% elif message.role == 'assistant' -%}
<|im_start|>assistant
{{ message.content }}
{%- for tc in message.tool_calls or [] -%}
{%- set fn = tc.function if tc.function is defined else tc %}
<tool_call>
<function={{ fn.name }}>
{% for k, v in fn.arguments|items -%}
<parameter={{ k }}>
{{ v if v is string else (v | tojson) }}
</parameter>
{% endfor -%}
</function>
</tool_call>
{%- endfor -%}
<|im_end|>
{% elif message.role == 'tool' -%}
<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
<|im_start|>assistant
{% if enable_thinking is defined and enable_thinking is false %}<think>

</think>

{% else %}<think>
{% endif -%}
{%- endif -%}
""".strip() + "\n"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerProcess:
    """A `python -m lucebox serve` child process on 127.0.0.1."""

    def __init__(self, args: list[str], log_path: Path, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "lucebox", "serve", "--host", "127.0.0.1", "--port", str(self.port),
               "--device", "cpu", "--threads", "2", *args]
        self.log_path = log_path
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, cwd=str(REPO),
                                     env={**os.environ, **(env or {})})
        self._wait_ready(60.0)

    def _wait_ready(self, timeout: float) -> None:
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(self.base_url + "/health", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"server not ready after {timeout} s:\n{self.log()}")

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def rss_kib(self) -> int:
        """Resident memory of the server process (KiB), from /proc."""
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return -1

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._log.close()
