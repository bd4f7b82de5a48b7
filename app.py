"""Builds and launches the composed image search demo (Hugging Face Space entry point)."""
from engine.config import set_default_environment

# Gradio's usage analytics rebuild a summary after every event, so a long-running server slows down; off.
set_default_environment(GRADIO_ANALYTICS_ENABLED="False")

from demo.api import api_middleware, api_routes  # noqa: E402
from demo.ui import CSS, HEAD, allowed_paths, build_demo  # noqa: E402
from engine.config import Settings  # noqa: E402
from engine.service import load_default_engine  # noqa: E402

settings = Settings()  # every setting (README, 'Configuration'), read once
engine = load_default_engine(settings)
demo = build_demo(settings, engine=engine)

if __name__ == "__main__":
    demo.launch(
        server_name=settings.server_name,
        server_port=settings.server_port,
        allowed_paths=allowed_paths(engine),
        max_file_size=f"{int(settings.max_zip_mb)}mb",
        state_session_capacity=max(1, settings.state_sessions),  # per-call state bounded (memory flat under the API)
        css=CSS,
        head=HEAD,  # demo/ui.py: drops Gradio's one meaningless console warning
        show_error=False,  # unexpected errors show a plain sentence (demo/handlers.py user_errors)
        app_kwargs={"routes": api_routes(engine, settings),  # POST /api/search beside the page (demo/api.py)
                    "middleware": api_middleware(settings)},  # idle request bodies closed (408)
    )
