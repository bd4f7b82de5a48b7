"""Gradio UI for the composed image search engine: layout, events and formatting only."""
