"""Model backends behind one interface (chat messages in; text, token ids and log-probs out).

``load_backend("hf:smollm2-135m")`` builds one from an agent spec; ``HFBackend``,
``VLLMBackend`` (``crl_harness.models.vllm``) and ``OpenAIBackend``
(``crl_harness.models.openai``) can also be built directly. Importing this package imports
neither torch nor vllm.
"""

from crl_harness.models.base import (
    BackendUnavailableError,
    Generation,
    Message,
    ModelBackend,
    ModelNotFoundError,
)
from crl_harness.models.hf import HFBackend
from crl_harness.models.names import MODELS, resolve_model
from crl_harness.models.registry import load_backend

__all__ = [
    "BackendUnavailableError",
    "Generation",
    "HFBackend",
    "MODELS",
    "Message",
    "ModelBackend",
    "ModelNotFoundError",
    "load_backend",
    "resolve_model",
]
