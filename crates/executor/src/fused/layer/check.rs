//! The launch's data dependencies, checked (filled in below).
