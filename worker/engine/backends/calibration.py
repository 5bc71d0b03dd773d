"""Sample texts that int8 calibration measures activation ranges on (NNCF for --engine openvino).

Kept apart from the fidelity probe texts (worker/engine/fidelity.py), so that the gate measures int8 on
texts it was not tuned to. Mixed on purpose: short and long, prose, questions, code, numbers, other
languages, the shapes of queries and passages a fleet embeds.
"""

from __future__ import annotations

import hashlib

CALIBRATION_TEXTS = (
    "hello",
    "what is the weather like today?",
    "how do I reset my password",
    "cheap flights to tokyo in april",
    "Return a list of the keys in the dictionary, sorted by value.",
    "Raises ValueError if the input is empty or not a number.",
    "The mitochondria is the powerhouse of the cell, producing most of its chemical energy.",
    "In 1969, Apollo 11 landed on the Moon and Neil Armstrong became the first person to walk on it.",
    "for i in range(10):\n    print(i * i)",
    "SELECT name, count(*) FROM users GROUP BY name ORDER BY 2 DESC LIMIT 10;",
    "query: best practices for caching embeddings in redis",
    "passage: A vector database stores embeddings and answers nearest-neighbour queries over them.",
    "Der schnelle braune Fuchs springt über den faulen Hund.",
    "La tour Eiffel a été construite pour l'Exposition universelle de 1889.",
    "El aprendizaje automático permite a los ordenadores aprender de los datos.",
    "Error 503: service unavailable, retry after 30 seconds",
    "I loved this movie! The acting was great, but the ending felt rushed.",
    "Terrible service, the food was cold and we waited an hour.",
    "Photosynthesis converts light energy into chemical energy stored in glucose, releasing oxygen as a "
    "by-product; it takes place in the chloroplasts of plant cells and some algae and bacteria.",
    "The function computes the cosine similarity between two vectors by dividing their dot product by the "
    "product of their norms, returning a value between -1 and 1; zero vectors raise an error.",
    "Shares rose 4.2% to $187.35 after the company reported quarterly revenue of $21.3 billion.",
    "Take two tablets every 6 hours with water; do not exceed 8 tablets in 24 hours.",
    "async def fetch(url: str) -> bytes:\n    async with session.get(url) as response:\n        return await "
    "response.read()",
    "Customers who bought this item also bought: USB-C cable, 65W charger, laptop sleeve.",
    "The committee will meet on Tuesday to review the budget proposal and vote on the new hiring plan, "
    "which would add twelve engineers and three product managers over the next two quarters.",
    "OK",
    "¿Dónde está la biblioteca?",
    "東京は日本の首都です。",
    "Args:\n    path: the file to read.\n    encoding: its text encoding (default utf-8).\nReturns:\n    the text.",
    "A long walk along the river at dusk, past the old mill and the bridge, ends at the village square where "
    "the market sells bread, cheese, apples and honey from the hills around it every Saturday morning.",
    "kubectl get pods --all-namespaces -o wide | grep CrashLoopBackOff",
    "Why is the sky blue? Rayleigh scattering of sunlight by the molecules of the atmosphere.",
    # Structured text: tables, identifier lists and runs of punctuation drive activations far from prose's.
    "+----------+---------+-------+\n| name     | type    | value |\n+==========+=========+=======+\n| timeout  "
    "| float   | 30.0  |\n+----------+---------+-------+\n| retries  | int     | 3     |\n+----------+---------+"
    "-------+\n| verbose  | bool    | False |\n+----------+---------+-------+",
    "ERROR_INVALID_HANDLE ERROR_ACCESS_DENIED ERROR_FILE_NOT_FOUND ERROR_PATH_NOT_FOUND ERROR_TOO_MANY_OPEN_FILES "
    "ERROR_NOT_ENOUGH_MEMORY ERROR_INVALID_PARAMETER ERROR_BROKEN_PIPE ERROR_SHARING_VIOLATION ERROR_LOCK_VIOLATION",
    "==== ---- ==== ---- >>> ... ... >>> *** ### ### *** ~~~ ~~~ ((( ))) [[[ ]]] {{{ }}} <<< >>> ||| ||| :::: ::::",
    "0x7f3a 0x0000 0xffff 0xdeadbeef 127.0.0.1:6379 2026-12-03T19:05:00Z 3.14159e-10 -42 +1.5E+300 1,234,567.89",
)


def calibration_samples(max_chars: int = 4000) -> list[str]:
    """The texts, plus a few long inputs made of them (an int8 scale must also cover the longest positions)."""
    joined = [" ".join(CALIBRATION_TEXTS[start::4])[:max_chars] for start in range(4)]
    return list(CALIBRATION_TEXTS) + joined


def calibration_digest() -> str:
    """Part of an int8 export's cache key: other calibration texts make another export."""
    return hashlib.sha256("\0".join(calibration_samples()).encode()).hexdigest()[:16]
