"""A DeepSpeed ``ds_config.json`` (``train_micro_batch_size_per_gpu``, ``gradient_accumulation_steps``,
``train_batch_size``, ``zero_optimization.stage``, ``bf16`` / ``fp16``) as the split's fields.
"""

from __future__ import annotations

from pathlib import Path

from netmorph.errors import UsageError
from netmorph.files import printable, read_json_object
from netmorph.mesh.configs.hf import _int

# keys only a Hugging Face config.json has: such a file given as --deepspeed-config is a mistake
_HF_KEYS = ("model_type", "architectures", "num_hidden_layers", "hidden_size", "vocab_size")
AUTO = "auto"  # what Hugging Face's Trainer writes for a value it fills in from its own arguments


def from_deepspeed_config(path) -> tuple[dict, list]:
    """(split fields, keys not modelled) from a DeepSpeed config: the batch sizes, the ZeRO stage, the precision.

    ``"auto"`` (as Hugging Face's Trainer writes a ds_config for ``--deepspeed``) leaves that value to the
    other flags or to the search, as the Trainer fills it from its own arguments."""
    path = Path(path)
    cfg = read_json_object(path, "deepspeed_config")
    where = printable(path.name)
    hf = [k for k in _HF_KEYS if k in cfg]
    if hf:
        raise UsageError(
            f"{{deepspeed_config}} {where} is a Hugging Face model config ({', '.join(hf)}), not a "
            f"DeepSpeed config: pass it as --model-config",
            "deepspeed_config",
        )
    split, unknown = {}, []

    def count(key, value, lo=1):
        return None if value == AUTO else _int(value, key, where, "deepspeed_config", lo)

    for key, value in cfg.items():
        if key == "train_micro_batch_size_per_gpu":
            split["microbatch"] = count(key, value)
        elif key == "gradient_accumulation_steps":
            split["grad_accum"] = count(key, value)
        elif key == "train_batch_size":
            split["global_batch"] = count(key, value)
        elif key == "zero_optimization":
            if not isinstance(value, dict):
                raise UsageError(
                    f"{{deepspeed_config}} {where}: zero_optimization must be an object of fields, got {value!r}",
                    "deepspeed_config",
                )
            stage = value.get("stage", 0)
            if isinstance(stage, bool) or stage not in (0, 1, 2, 3):
                raise UsageError(
                    f"{{deepspeed_config}} {where}: zero_optimization.stage must be 0-3, got {stage!r}",
                    "deepspeed_config",
                )
            split["zero"] = stage
            unknown += [f"zero_optimization.{printable(k)}" for k in value if k not in ("stage", "overlap_comm")]
            overlap = value.get("overlap_comm", False)
            if overlap not in (True, False, AUTO):
                raise UsageError(
                    f"{{deepspeed_config}} {where}: zero_optimization.overlap_comm must be true, false "
                    f'or "auto", got {overlap!r}',
                    "deepspeed_config",
                )
            if overlap is True:
                split["dp_overlap"] = True
        elif key in ("bf16", "fp16"):
            enabled = value.get("enabled", False) if isinstance(value, dict) else None
            if enabled not in (True, False, AUTO):
                raise UsageError(
                    f'{{deepspeed_config}} {where}: {key} must be an object with "enabled": true, '
                    f'false or "auto", got {value!r}',
                    "deepspeed_config",
                )
            if enabled is True:
                split["precision"] = "bf16"  # 16-bit matmuls; "auto": the search decides
        else:
            unknown.append(printable(key))
    return {k: v for k, v in split.items() if v is not None}, unknown
