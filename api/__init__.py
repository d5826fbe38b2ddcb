"""The HTTP service: FastAPI app, routes under /api/v1, schemas, auth, dashboard pages."""
