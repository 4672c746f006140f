"""Creating and configuring runs: their lifecycle and settings (``services``, ``forms``), their text
data (``corpus``), their tokenizer (``tokenization``) and what one sample costs to train (``compute``)."""
