"""rkaudio: checkpoints of TTS/ASR models to validated .rknn engines. Each folder is one room, bottom up: `board`
(the board kit), `core`, `gates`, `toolkit`, `host`, `surgery`, `engine`, `pipeline`, `release`, `families/<name>`,
`cli`; a room imports only rooms below it (HACKING.md has the map). Imports nothing: the converter-venv child
(`python -m rkaudio.toolkit.child`) and the board kit, which ships this file, load only what they name."""
