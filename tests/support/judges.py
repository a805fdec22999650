"""Judge settings and groups shared by the served-judge tests (llama.cpp's server)."""

from __future__ import annotations

from typing import Any

from tests.support.llama_server import MODEL_ALIAS

SHORT_RATING = 'root ::= "Rating: " [1-9] "\\nRationale: " [a-z]+ "."'  # a short rubric answer


GROUPS = [{"prompt": "What is 2 + 2?", "responses": ["4", "It is 4."]},
          {"prompt": "Name the capital of France.", "responses": ["Paris.", "London."]}]


def _judge(url: str, **settings: Any) -> dict[str, Any]:
    server = {"base_url": url, "concurrency": 2, **settings.pop("server", {})}
    return {"kind": "judge", "backend": "openai", "model": MODEL_ALIAS, "server": server,
            **settings}


LLAMA_NEUTRAL = {"top_k": 0, "min_p": 0.0, "repeat_penalty": 1.0}
