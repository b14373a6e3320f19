"""The composition root and what runs the service: it builds the rooms below and hands each
what it needs (``service``), runs the detectors and the API process over the store."""
