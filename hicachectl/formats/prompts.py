"""Prompts for verify and bench: unique by salt, about one token per word in common tokenizers.

The salt comes first, so two prompts with different salts share no page and a cold run never hits
another run's pages. Words are drawn from short common English words, which BPE vocabularies hold
as single tokens; the server's reported prompt_tokens is what counts, and the reports show it.
"""

from __future__ import annotations

import random

WORDS = tuple("""
the of and to in is it you that he was for on are as with his they at be this have from or one had by
word but not what all were we when your can said there use an each which she do how their if will up
other about out many then them these so some her would make like him into time has look two more write
go see number no way could people my than first water been call who oil its now find long down day did
get come made may part over new sound take only little work know place year live me back give most very
after thing our just name good sentence man think say great where help through much before line right too
mean old any same tell boy follow came want show also around form three small set put end does another
well large must big even such because turn here why ask went men read need land different home us move
try kind hand picture again change off play spell air away animal house point page letter mother answer
found study still learn should world high every near add food between own below country plant last school
father keep tree never start city earth eye light thought head under story saw left few while along might
close something seem next hard open example begin life always those both paper together got group often run
""".split())


def prompt(salt: str, words: int) -> str:
    """`words` words after the salt, the same text for the same salt on every machine."""
    rng = random.Random(salt)
    return f"{salt} " + " ".join(rng.choices(WORDS, k=max(words - 1, 0)))


def chat_request(model: str, text: str, stream: bool = False) -> dict:
    """One OpenAI chat request that asks for a single output token, as the seeds' benchmark does (OSL=1)."""
    request = {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 1, "temperature": 0}
    if stream:
        request.update(stream=True, stream_options={"include_usage": True})
    return request
