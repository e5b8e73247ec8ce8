"""Prompt sets the project writes or generates itself (nothing is downloaded).

* ``code`` — code completion: the signature and docstring of functions from the Python
  standard library (read with :mod:`inspect` from this interpreter's own sources);
* ``arithmetic`` — templated word problems with their exact answers;
* ``instructions`` — short hand-written instructions;
* ``docstrings`` — "summarise this" over standard-library docstrings;
* ``edit`` — code editing: a standard-library function's source with a small change to make
  (rename a parameter, add type hints), to be returned whole — an answer that mostly copies
  its prompt, the case n-gram and suffix lookup drafting is for;
* ``extract`` — extraction: templated records of people (name, city, age, job) in prose, to be
  listed line by line in a fixed format — again mostly text of the prompt.

:data:`SETS` are the sets drafters are trained and bigram tables fitted on (``draftsim distill``,
Max-Gram's fallback); :data:`LOOKUP_SETS` (``edit``, ``extract``) are for measuring lookup
drafting and are not trained on; :data:`ALL_SETS` is every set.

Every prompt has a stable id and a fixed train/test split (a hash of its text, 80/20), so
the same prompt is always on the same side.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import random
from dataclasses import dataclass

from ..sim.errors import DraftsimError

__all__ = ["Prompt", "SETS", "LOOKUP_SETS", "ALL_SETS", "prompt_set", "format_prompt"]

SETS = ("code", "arithmetic", "instructions", "docstrings")
LOOKUP_SETS = ("edit", "extract")
ALL_SETS = SETS + LOOKUP_SETS

_STDLIB_MODULES = (
    "textwrap", "string", "shlex", "fnmatch", "posixpath", "bisect", "heapq", "calendar", "colorsys",
    "json.encoder", "json.decoder", "html", "base64", "quopri", "difflib", "statistics", "fractions",
    "keyword", "glob", "copy", "pprint", "reprlib", "graphlib", "netrc", "csv", "random", "operator",
)


@dataclass(frozen=True)
class Prompt:
    """One prompt: ``set`` name, stable ``id`` within the set, ``text``, optional ``answer``."""

    set: str
    id: int
    text: str
    answer: str | None = None

    @property
    def split(self) -> str:
        digest = hashlib.sha256(f"{self.set}\0{self.text}".encode()).digest()
        return "test" if digest[0] < 52 else "train"  # ~20% test


def _functions():
    out = []
    for name in _STDLIB_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        for attr in sorted(vars(module)):
            fn = getattr(module, attr)
            if not inspect.isfunction(fn) or fn.__module__ != module.__name__ or attr.startswith("_"):
                continue
            try:
                source = inspect.getsource(fn)
            except (OSError, TypeError):
                continue
            out.append((name, attr, fn, source))
    return out


def _code_prompts():
    prompts = []
    for module, _attr, fn, source in _functions():
        lines = source.splitlines()
        doc = inspect.getdoc(fn)
        if not doc or len(lines) < 4:
            continue
        # The header (signature and docstring) as written, then the model completes the body.
        body_start = next((i for i, line in enumerate(lines) if i > 0 and line.strip() and not line.strip().startswith(('"', "'")) and i > _doc_end(lines)), None)
        if body_start is None:
            continue
        header = "\n".join(lines[:body_start])
        prompts.append(f"# Python, module {module}\n{header}\n")
    return prompts


def _doc_end(lines: list[str]) -> int:
    """Index of the line that closes the function's docstring (0 if none)."""
    quotes = 0
    for i, line in enumerate(lines):
        quotes += line.count('"""') + line.count("'''")
        if quotes >= 2:
            return i
    return 0


def _docstring_prompts():
    out = []
    for module, attr, fn, _ in _functions():
        doc = inspect.getdoc(fn)
        if doc and 80 <= len(doc) <= 900:
            out.append(f"Summarise in one sentence what this Python function does.\n\n{module}.{attr}: {doc}")
    return out


_ITEMS = ["apples", "books", "marbles", "stickers", "pencils", "cookies", "stamps", "coins", "shells", "cards"]
_NAMES = ["Ana", "Ben", "Chloe", "Dev", "Emma", "Farid", "Grace", "Hugo", "Iris", "Jonas", "Kemal", "Lena"]


def _arithmetic_prompts(n: int = 200):
    rng = random.Random(20261122)
    out = []
    for _ in range(n):
        a, b, c = rng.randint(2, 60), rng.randint(2, 40), rng.randint(2, 9)
        name, other, item = rng.choice(_NAMES), rng.choice(_NAMES), rng.choice(_ITEMS)
        kind = rng.randrange(4)
        if kind == 0:
            text, ans = f"{name} has {a} {item}. {other} gives {name} {b} more. How many {item} does {name} have now?", a + b
        elif kind == 1:
            a = a + b
            text, ans = f"{name} had {a} {item} and gave {b} of them to {other}. How many {item} does {name} have left?", a - b
        elif kind == 2:
            text, ans = f"{name} buys {c} boxes of {item} with {b} {item} in each box. How many {item} is that in total?", b * c
        else:
            total = b * c
            text, ans = f"{name} shares {total} {item} equally among {c} friends. How many {item} does each friend get?", b
        out.append((text + " Answer with the number first, then explain.", str(ans)))
    return out


_INSTRUCTIONS = [
    "Write a haiku about the sea.",
    "Explain what a hash table is in two sentences.",
    "List three tips for writing clear emails.",
    "Translate 'good morning, how are you?' into French.",
    "Give a one-line definition of photosynthesis.",
    "Write a Python function that reverses a string.",
    "What is the difference between a list and a tuple in Python?",
    "Suggest a name for a bakery that sells only bread.",
    "Describe the water cycle to a ten-year-old.",
    "Write a short thank-you note to a teacher.",
    "Explain recursion with a simple example.",
    "What are the primary colours?",
    "Give three synonyms for 'happy'.",
    "Write a SQL query that counts the rows of a table named users.",
    "Explain why the sky is blue in one paragraph.",
    "Write a limerick about a cat who loves boxes.",
    "Summarise the plot of Cinderella in three sentences.",
    "What is the capital of Japan, and what is it known for?",
    "Write a regular expression that matches an email address.",
    "Explain what an API is to a non-programmer.",
    "List the planets of the solar system in order.",
    "Give two reasons to learn a second language.",
    "Write a bash command that counts the lines of a file.",
    "What does HTTP stand for, and what does it do?",
    "Describe a healthy breakfast.",
    "Write a motivational sentence for someone starting a new job.",
    "Explain the difference between weather and climate.",
    "Write a Python list comprehension that squares the numbers 1 to 10.",
    "How many minutes are there in a day? Show the calculation.",
    "Explain what a binary search does.",
    "Write a four-line poem about autumn leaves.",
    "Give a short definition of machine learning.",
    "What is the boiling point of water at sea level in Celsius and Fahrenheit?",
    "Write an apology message for missing a meeting.",
    "Explain what version control is and why it helps.",
    "List five fruits that are red.",
    "Write a JavaScript function that adds two numbers.",
    "Describe the taste of lemon to someone who has never had one.",
    "What is the Pythagorean theorem?",
    "Give an example of a metaphor and explain it.",
]


def _edit_prompts():
    """A function's whole source (short ones: at most 24 lines) and one edit to make."""
    out = []
    for _module, _attr, fn, source in _functions():
        lines = source.splitlines()
        params = [p for p in inspect.signature(fn).parameters if p not in ("self", "cls")]
        if not 4 <= len(lines) <= 24 or not params:
            continue
        if len(out) % 2 == 0:
            task = f"Rename the parameter `{params[0]}` to `{params[0]}_value` everywhere in this function"
        else:
            task = "Add type hints to the signature of this function, changing nothing else"
        out.append(f"{task}, and return the whole function in one code block.\n\n```python\n{source.rstrip()}\n```")
    return out


_CITIES = ["Lisbon", "Oslo", "Nairobi", "Lima", "Osaka", "Perth", "Quebec", "Tunis", "Vienna", "Quito", "Hanoi", "Turin"]
_JOBS = ["nurse", "baker", "pilot", "teacher", "plumber", "chemist", "librarian", "architect", "farmer", "translator"]


def _extract_prompts(n: int = 120):
    """Three to six people described in prose, to be listed as ``name | city | age | job``."""
    rng = random.Random(20261124)
    out = []
    for _ in range(n):
        people = rng.sample(_NAMES, rng.randint(3, 6))
        prose = " ".join(f"{name} is a {rng.choice(_JOBS)} from {rng.choice(_CITIES)} who is {rng.randint(19, 78)} years old."
                         for name in people)
        out.append(f"{prose}\n\nList every person on a line of their own as `name | city | age | job`, in the order above.")
    return out


def _build(name: str) -> list[Prompt]:
    if name == "code":
        texts = [(t, None) for t in _code_prompts()]
    elif name == "arithmetic":
        texts = _arithmetic_prompts()
    elif name == "instructions":
        texts = [(t, None) for t in _INSTRUCTIONS]
    elif name == "docstrings":
        texts = [(t, None) for t in _docstring_prompts()]
    elif name == "edit":
        texts = [(t, None) for t in _edit_prompts()]
    elif name == "extract":
        texts = [(t, None) for t in _extract_prompts()]
    else:
        raise DraftsimError(f"unknown prompt set {name!r}; known: {', '.join(ALL_SETS)}")
    seen, out = set(), []
    for text, answer in texts:
        if text in seen:
            continue
        seen.add(text)
        out.append(Prompt(name, len(out), text, answer))
    return out


def prompt_set(name: str, split: str | None = None, n: int | None = None) -> list[Prompt]:
    """The prompts of set ``name`` (optionally one split), the first ``n`` of them."""
    if split not in (None, "train", "test"):
        raise DraftsimError(f"split must be train or test; got {split!r}")
    prompts = [p for p in _build(name) if split is None or p.split == split]
    if n is not None:
        if n < 1:
            raise DraftsimError(f"n must be >= 1; got {n}")
        prompts = prompts[:n]
    if not prompts:
        raise DraftsimError(f"prompt set {name!r} has no {split or ''} prompts here")
    return prompts


def format_prompt(prompt: Prompt, tokenizer) -> list[int]:
    """Token ids of a prompt: through the chat template for instruct models (not for code
    completion, which is raw text), else the raw text."""
    if prompt.set != "code" and getattr(tokenizer, "chat_template", None):
        out = tokenizer.apply_chat_template([{"role": "user", "content": prompt.text}], add_generation_prompt=True, return_dict=True)
        return list(out["input_ids"])
    return list(tokenizer(prompt.text)["input_ids"])
