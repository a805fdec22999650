"""The judge prompts: the same text whether the judge runs in process
(:mod:`grouppref.pipeline.rank.model_rankers`) or on a server
(:mod:`grouppref.pipeline.rank.server_judge`)."""

from __future__ import annotations

POINTWISE_TEMPLATE = ("Here is a request and a response.\n\n[Request]\n{prompt}\n\n[Response]\n"
                      "{answer}\n\n{question} Answer with Yes or No.")
PAIRWISE_TEMPLATE = ("Here is a request and two responses.\n\n[Request]\n{prompt}\n\n"
                     "[Response A]\n{a}\n\n[Response B]\n{b}\n\nWhich response is better? "
                     "Answer with A or B.")
