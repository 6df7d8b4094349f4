"""Offline facts about models, read from their config and tokenizer (no weights, no runtime):
named shapes (``shapes``), target/draft compatibility (``pairing``), the GPU memory plan
(``memory_plan``). The CLI's ``check-pair`` and ``plan-memory`` and the engine's draft-model
check use them; the runner does not."""
