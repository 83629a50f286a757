"""Language models behind the agent loop: adapters from a provider's API to ringfence.turns'
ModelClient (`next_turn(context) -> ModelTurn`).

    ringfence.models.openai      OpenAIChatModel: Chat Completions with tools, any compatible
                                 server by base URL (`pip install 'ringfence[openai]'`)
    ringfence.models.anthropic   AnthropicMessagesModel: the Messages API with tool_use blocks
                                 (`pip install 'ringfence[anthropic]'`)
    ringfence.models.errors      ModelError and its two kinds: refused (never retried) and
                                 unavailable (transient, retries exhausted)
    ModelRetry                   how an adapter retries a request and how long one may take
                                 (its `retry=`)

Importing this package imports no provider library: each adapter module imports its own.
"""

from ringfence.models._common import ModelRetry
from ringfence.models.errors import ModelError, ModelRequestRefused, ModelUnavailable

__all__ = ["ModelError", "ModelRequestRefused", "ModelRetry", "ModelUnavailable"]
