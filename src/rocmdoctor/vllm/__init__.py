"""What rocmdoctor knows about vLLM, pure and versioned in one place: its server flags, its startup memory
rule, its KV-cache arithmetic (the memory plan), a model's files and layer kinds, the environment its
interpreter runs in, and the metrics it exports."""
