"""The pipeline's Prefect tasks and the request and result types they pass between them."""
