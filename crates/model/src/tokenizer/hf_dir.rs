//! Loading a tokenizer from a Hugging Face model directory.
