"""An OpenAI-compatible endpoint over the policy's sampler that records exact tokens (``seeupo serve``)."""
