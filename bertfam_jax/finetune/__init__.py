"""Fine-tuning pre-trained encoders on downstream tasks (`classify`: sequence classification)."""
