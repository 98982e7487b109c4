"""Fine-tuning pre-trained models on downstream tasks: `run` (an encoder's task head, or a T5's
text-to-text task through `seq2seq`), on the one train loop through `recipe`."""
