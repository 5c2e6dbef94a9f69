"""TensorRT-LLM 1.2.1's speculative_config facts that the API's validation and the renderer
share: which decoding type a method is, and which configs run a separate drafter."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# 1.2.1's DecodingBaseConfig.from_dict knows `Eagle` (EAGLE-3 on the PyTorch backend, one- or
# two-model by `eagle3_one_model`) and refuses `Eagle3` ("Invalid decoding type"), which came
# later with the discriminated-union configs (TensorRT-LLM PR 10124); `speculative_model_dir` is
# an alias of `speculative_model` there.
DECODING_TYPE = {"eagle3": "Eagle", "mtp": "MTP", "ngram": "NGram", "draft_model": "DraftTarget"}


def runs_a_drafter(options: Mapping[str, Any]) -> bool:
    """Whether 1.2.1 runs a drafter beside the target model for this speculative_config
    (get_spec_drafter: NGram, DraftTarget, Eagle with eagle3_one_model false, and MTP-Eagle
    two-model: MTP with mtp_eagle_one_model false, use_mtp_vanilla not set). Only there does its
    executor apply the acceptance gate and draft_len_schedule; one-model Eagle and MTP draft
    inside the target's forward. MTP-Eagle also needs a checkpoint with one MTP layer (as
    DeepSeek-V3/R1 have); on more, 1.2.1 runs vanilla MTP, and no option says which it has."""
    decoding_type = options.get("decoding_type")
    if decoding_type == "Eagle":
        return not options.get("eagle3_one_model", True)
    if decoding_type == "MTP":
        return not options.get("mtp_eagle_one_model", True) and not options.get("use_mtp_vanilla")
    return decoding_type in ("NGram", "DraftTarget")
