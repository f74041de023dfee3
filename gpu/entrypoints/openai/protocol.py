"""The OpenAI API's request bodies, and its error shape.

Requests are pydantic models in strict mode, so a wrong type (`"max_tokens": "many"`,
`"temperature": "hot"`) is a 400 that names the field, as OpenAI answers it. Fields OpenAI has
and tinychat does not serve (`n` > 1, `logprobs`, tools, images) parse, so that the server can
say "not supported" instead of "unknown field"; fields neither knows are ignored, as vLLM does.
Responses are built as plain dicts (serving_*.py): a streamed token goes out as one small JSON
object, and building a pydantic model per token per stream would cost the event loop more than
the HTTP write does.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError


class OpenAIError(Exception):
    """An error the client should see, with its HTTP status (OpenAI's `error` object)."""

    def __init__(
        self,
        message: str,
        status: int = HTTPStatus.BAD_REQUEST,
        *,
        type: str | None = None,
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = int(status)
        self.type = type or _ERROR_TYPES.get(self.status, "invalid_request_error")
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    500: "server_error",
    503: "server_error",
}


class _Request(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")

    @classmethod
    def parse(cls, body: bytes) -> _Request:
        """The body as this request, or OpenAIError(400) naming what is wrong."""
        try:
            return cls.model_validate_json(body or b"null")
        except ValidationError as error:
            raise OpenAIError(_describe(error), param=_first_param(error)) from None


def _describe(error: ValidationError) -> str:
    parts = []
    for item in error.errors(include_url=False)[:3]:
        where = ".".join(str(p) for p in item["loc"])
        if item["type"] == "json_invalid":
            parts.append(f"the body is not valid JSON ({item['msg']})")
        elif where:
            parts.append(f"{where}: {item['msg']}")
        else:
            parts.append(f"the body must be a JSON object ({item['msg']})")
    return "; ".join(parts)


def _first_param(error: ValidationError) -> str | None:
    for item in error.errors(include_url=False):
        if item["loc"]:
            return ".".join(str(p) for p in item["loc"])
    return None


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    include_usage: bool = False


class ChatMessage(BaseModel):
    """One message; `content` may be a string or a list of parts (only text parts serve)."""

    model_config = ConfigDict(strict=True, extra="ignore")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None


class _SamplingRequest(_Request):
    """The fields chat and completions share: OpenAI's, then vLLM's extras."""

    model: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    n: int = 1
    logprobs: Any = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    # vLLM's extras (in the body, or through the openai client's `extra_body`)
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    # vLLM's: the prompt's and the reply's token ids beside the text (streamed: the prompt's in
    # the first chunk, each chunk's new ids in its choice's `token_ids`)
    return_token_ids: bool | None = None


class ChatCompletionRequest(_SamplingRequest):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    top_logprobs: int | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    functions: list[Any] | None = None
    function_call: Any = None
    response_format: dict[str, Any] | None = None
    modalities: list[str] | None = None
    audio: Any = None


class CompletionRequest(_SamplingRequest):
    prompt: str | list[int] | list[str] | list[list[int]]
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None
