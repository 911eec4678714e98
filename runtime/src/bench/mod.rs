pub mod aggregate;
