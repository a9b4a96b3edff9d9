"""Type stubs of the C++ extension lucebox._core (see cpp/bindings/)."""
from typing import Any

import numpy as np
import numpy.typing as npt

TensorSpec = tuple[str, tuple[int, ...], str, bool]  # (name, ggml shape, role, required)
TensorEntry = tuple[str, str, tuple[int, ...], int]  # (name, ggml type, ggml shape, nbytes)

def build_info() -> dict[str, Any]: ...
def devices() -> list[dict[str, Any]]: ...

class Qwen35HParams:
    n_vocab: int
    n_ctx_train: int
    n_embd: int
    n_layer: int
    n_nextn: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_rot: int
    rope_sections: list[int]
    rope_freq_base: float
    attn_scale: float
    rms_eps: float
    ssm_d_conv: int
    ssm_d_state: int
    ssm_n_k_heads: int
    ssm_n_v_heads: int
    is_recurrent: list[bool]
    has_output: bool
    @property
    def key_dim(self) -> int: ...
    @property
    def value_dim(self) -> int: ...
    @property
    def conv_dim(self) -> int: ...
    @property
    def n_attention_layers(self) -> int: ...
    @property
    def n_recurrent_layers(self) -> int: ...
    def __init__(self) -> None: ...
    def validate(self) -> None: ...
    def tensor_specs(self) -> list[TensorSpec]: ...

class DFlashHParams:
    n_embd: int
    n_layer: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_rot: int
    rope_freq_base: float
    rms_eps: float
    block_size: int
    mask_token_id: int
    target_layers: list[int]
    causal: bool
    n_vocab: int
    has_token_embd: bool
    has_output: bool
    def __init__(self) -> None: ...
    def validate(self) -> None: ...
    def tensor_specs(self) -> list[TensorSpec]: ...

class TargetFile:
    @staticmethod
    def open(path: str) -> TargetFile: ...
    @property
    def path(self) -> str: ...
    @property
    def file_size(self) -> int: ...
    @property
    def hparams(self) -> Qwen35HParams: ...
    @property
    def weight_bytes(self) -> int: ...
    @property
    def tensors(self) -> list[TensorEntry]: ...
    @property
    def bytes_by_type(self) -> dict[str, int]: ...

class DraftFile:
    @staticmethod
    def open(path: str) -> DraftFile: ...
    @property
    def path(self) -> str: ...
    @property
    def file_size(self) -> int: ...
    @property
    def hparams(self) -> DFlashHParams: ...
    @property
    def weight_bytes(self) -> int: ...
    @property
    def tensors(self) -> list[TensorEntry]: ...
    @property
    def bytes_by_type(self) -> dict[str, int]: ...

def validate_draft(target: TargetFile, draft: DraftFile) -> None: ...
def plan_memory(target: TargetFile, draft: DraftFile | None = None, n_ctx: int = 4096, n_seq: int = 1,
                kv_type_k: str = "f16", kv_type_v: str = "f16", verify_tokens: int = 16,
                ubatch: int = 512) -> dict[str, int]: ...
def quantize(rows: npt.ArrayLike, type: str, n_threads: int = 0) -> npt.NDArray[np.uint8]: ...
def ggml_type_traits(type: str) -> tuple[str, int, int]: ...
