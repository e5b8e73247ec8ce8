"""Real-model layer: executes the sim policies on Hugging Face models (later issues)."""
