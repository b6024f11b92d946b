//! The crate's declarative macros, in a file of their own so the modules that use them
//! (`model`, `budget`) need not import each other for them.
//!
//! Owns `string_enum`, the `as_str`/`parse`/`Display` boilerplate of a closed string enum.
//! Does not declare any type.

/// Implements `as_str` and `parse` for a closed, snake_case string enum.
macro_rules! string_enum {
    ($name:ident { $($variant:ident => $text:literal),+ $(,)? }) => {
        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The stable string form, as stored and sent on the wire.
            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $text),+ }
            }

            /// Parses the stable string form.
            pub fn parse(value: &str) -> Option<$name> {
                match value { $($text => Some($name::$variant),)+ _ => None }
            }

            /// The accepted values, for error messages.
            pub fn expected() -> String {
                [$($text),+].join(", ")
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                // `pad`, so widths and alignment in format strings apply.
                f.pad(self.as_str())
            }
        }
    };
}
pub(crate) use string_enum;
