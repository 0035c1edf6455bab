"""Where models and datasets come from: the hub, a local path, or an offline generator, prepared into a
persistent cache; and how each dataset's rows become prompt/completion pairs."""
