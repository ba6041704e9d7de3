"""Files shipped with the package. The embedded pair's folder lives here so that the loader
(:mod:`companion.models`) and the training recipe (:mod:`companion.tiny_pair`) both name it
without either depending on the other; the chat-request prompt set's folder
(:mod:`companion.chat_requests`) lives beside it."""
from __future__ import annotations

from pathlib import Path

#: Folder of the committed pair: ``tokenizer/``, ``target/``, ``drafter/``, ``prompts.jsonl``, ``manifest.json``.
DEFAULT_PAIR_DIR: Path = Path(__file__).resolve().parent / "default_pair"

#: Folder of SmolLM2-135M-Instruct's drafter (``companion build-drafter``): ``config.json``,
#: ``generation_config.json``, ``model.safetensors``, ``manifest.json``; no tokenizer (the target's).
SMOLLM2_DRAFTER_DIR: Path = Path(__file__).resolve().parent / "smollm2_drafter"

#: Folder of the chat-request prompt set written for this project (:mod:`companion.chat_requests`): ``prompts.jsonl``.
CHAT_REQUESTS_DIR: Path = Path(__file__).resolve().parent / "chat_requests"
