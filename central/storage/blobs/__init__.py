"""Chunk blob stores: a local directory (``local``) or an S3 bucket (``s3``)."""
