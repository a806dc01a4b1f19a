//! Glob patterns of ACL scopes: `*` matches any run of characters (also none), `?` exactly
//! one; every other character matches itself. Names cannot contain `*` or `?` (PROTOCOL §1), so
//! no escaping is needed.

/// A compiled scope pattern, e.g. `orders*` or `*`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Glob(Vec<char>);

impl Glob {
    /// Compiles `pattern`.
    pub(crate) fn new(pattern: &str) -> Self {
        Glob(pattern.chars().collect())
    }

    /// Whether the pattern is `*` (matches every name).
    pub(crate) fn is_any(&self) -> bool {
        !self.0.is_empty() && self.0.iter().all(|&c| c == '*')
    }

    /// Whether `name` matches the pattern.
    pub(crate) fn matches(&self, name: &str) -> bool {
        let name: Vec<char> = name.chars().collect();
        let pat = &self.0;
        // Iterative matcher with backtracking to the last `*` (linear for our patterns).
        let (mut p, mut n) = (0, 0);
        let mut star: Option<(usize, usize)> = None;
        while n < name.len() {
            if p < pat.len() && (pat[p] == '?' || pat[p] == name[n]) {
                p += 1;
                n += 1;
            } else if p < pat.len() && pat[p] == '*' {
                star = Some((p, n));
                p += 1;
            } else if let Some((sp, sn)) = star {
                p = sp + 1;
                n = sn + 1;
                star = Some((sp, sn + 1));
            } else {
                return false;
            }
        }
        pat[p..].iter().all(|&c| c == '*')
    }
}

#[cfg(test)]
mod tests {
    use super::Glob;

    #[test]
    fn globs() {
        let cases = [
            ("*", "anything", true),
            ("*", "", true),
            ("orders*", "orders", true),
            ("orders*", "orders-eu", true),
            ("orders*", "order", false),
            ("*-eu", "orders-eu", true),
            ("*-eu", "orders-us", false),
            ("a?c", "abc", true),
            ("a?c", "ac", false),
            ("a*b*c", "axxbyyc", true),
            ("a*b*c", "axxbyy", false),
            ("billing", "billing", true),
            ("billing", "billing2", false),
            ("", "", true),
            ("", "x", false),
        ];
        for (pat, name, want) in cases {
            assert_eq!(Glob::new(pat).matches(name), want, "{pat} vs {name}");
        }
        assert!(Glob::new("**").is_any());
        assert!(!Glob::new("a*").is_any());
    }
}
