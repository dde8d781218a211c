"""Hugging Face integrations, as Ray's ``ray.train.huggingface`` (``.transformers``)."""
