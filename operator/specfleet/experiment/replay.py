"""The prompts a capacity phase replays (pure): a JSONL file, each line an OpenAI chat or
completion request body with the class of the request as `class`:

```json
{"class": "code", "messages": [{"role": "user", "content": "..."}], "max_tokens": 256}
{"class": "chat", "messages": [{"role": "user", "content": "..."}], "max_tokens": 128}
```

A request is known by its prompt (its `messages`, or its completion `prompt`), which is all a
load generator reports back of it: a prompt two classes share would be ambiguous.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from specfleet.yamlio import InputError


class Api(StrEnum):
    CHAT = "/v1/chat/completions"
    COMPLETIONS = "/v1/completions"


class ReplayRequest(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True, populate_by_name=True)

    class_name: str = Field(alias="class", min_length=1)
    messages: list[dict[str, Any]] | None = Field(default=None, min_length=1)
    prompt: str | None = Field(default=None, min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _one_prompt(self) -> ReplayRequest:
        if (self.messages is None) == (self.prompt is None):
            raise ValueError("give `messages` (chat) or `prompt` (completion), one of them")
        return self

    @property
    def api(self) -> Api:
        return Api.CHAT if self.messages is not None else Api.COMPLETIONS

    @property
    def output_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    @property
    def key(self) -> str:
        return prompt_key(self.messages if self.messages is not None else self.prompt)


def request_line(request: ReplayRequest) -> str:
    """The request as a line of a request file."""
    return request.model_dump_json(by_alias=True, exclude_none=True) + "\n"


def prompt_key(prompt: Any) -> str:
    """A chat request's messages or a completion's prompt, as a load generator echoes it."""
    return json.dumps(prompt, sort_keys=True, separators=(",", ":"))


def load_requests(path: Path) -> list[ReplayRequest]:
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise InputError(str(path), [str(exc)]) from None
    requests, problems = [], []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            requests.append(ReplayRequest.model_validate_json(line))
        except ValidationError as exc:
            problems += [f"line {number}: {_where(e)}{e['msg']}" for e in exc.errors()]
    problems += check_requests(requests)
    if problems:
        raise InputError(str(path), problems)
    return requests


def check_requests(requests: Sequence[ReplayRequest]) -> list[str]:
    if not requests:
        return ["no request to replay"]
    problems = []
    if len({r.api for r in requests}) > 1:
        problems.append("chat (`messages`) and completion (`prompt`) requests mixed: one API")
    classes: dict[str, set[str]] = {}
    for request in requests:
        classes.setdefault(request.key, set()).add(request.class_name)
    problems += [
        f"one prompt in classes {', '.join(sorted(names))}: a result could not be told apart"
        for names in classes.values()
        if len(names) > 1
    ]
    return problems


def _where(error: Any) -> str:
    location = ".".join(str(part) for part in error["loc"])
    return f"{location}: " if location else ""
