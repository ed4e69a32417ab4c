"""miles_amd: acceptance suite and AMD CI gate for the gpt-oss-20b MoE LoRA GRPO recipe."""
