"""Builds and launches the composed image search demo (Hugging Face Space entry point)."""
import os

# Gradio's usage analytics rebuild a summary after every event, so a long-running server slows down; off.
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

from demo.ui import allowed_paths, build_demo  # noqa: E402

demo = build_demo()

if __name__ == "__main__":
    demo.launch(
        server_name=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"),
        server_port=int(os.environ.get("GRADIO_SERVER_PORT", "7860")),
        allowed_paths=allowed_paths(demo.cis_engine),
        max_file_size=f"{int(float(os.environ.get('CIS_MAX_ZIP_MB', '200')))}mb",
        css=__import__("demo.ui", fromlist=["CSS"]).CSS,
        show_error=False,  # unexpected errors show a plain sentence (demo/handlers.py user_errors)
    )
