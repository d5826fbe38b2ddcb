FROM nvcr.io/nvidia/pytorch:25.01-py3
WORKDIR /app
COPY pyproject.toml README.md ./
COPY tuner tuner
COPY search_spaces search_spaces
COPY api api
COPY db db
RUN pip install --no-cache-dir ".[postgres]"
EXPOSE 8000
CMD ["tuner", "serve", "--host", "0.0.0.0"]
