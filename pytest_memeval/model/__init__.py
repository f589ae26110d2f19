"""The checkpoint side: file checks before anything loads (safetensors only, no remote code,
adapter fits base), loading (transformers + peft), chat-template prompts, and the controller's
preflight. Imports ``core`` only; torch and transformers are imported inside functions."""
