"""Container images for the workflow's tasks (one place to change base image, packages, builder)."""

from images.images import analysis_image, training_image

__all__ = ["analysis_image", "training_image"]
