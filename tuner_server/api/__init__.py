"""HTTP routes: each only translates a request into a service call and back."""
