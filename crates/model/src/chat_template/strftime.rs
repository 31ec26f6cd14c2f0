//! `strftime_now(format)` for chat templates (e.g. Llama 3.1 prints today's date): the
//! current UTC time formatted with the common C `strftime` directives.

use std::time::{SystemTime, UNIX_EPOCH};

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const WEEKDAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// A UTC calendar time, to the second.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CivilTime {
    pub year: i64,
    /// 1..=12
    pub month: u32,
    /// 1..=31
    pub day: u32,
    /// 0 = Monday .. 6 = Sunday
    pub weekday: u32,
    /// 1..=366
    pub day_of_year: u32,
    pub hour: u32,
    pub minute: u32,
    pub second: u32,
}

fn is_leap(year: i64) -> bool {
    (year % 4 == 0 && year % 100 != 0) || year % 400 == 0
}

impl CivilTime {
    /// The UTC calendar time `secs` seconds after 1970-01-01T00:00:00Z.
    pub fn from_unix(secs: i64) -> Self {
        let days = secs.div_euclid(86_400);
        let rem = secs.rem_euclid(86_400);
        // Walk whole years, then months; fine for any date a template will print.
        let mut year = 1970i64;
        let mut left = days;
        loop {
            let len = if is_leap(year) { 366 } else { 365 };
            if left < 0 {
                year -= 1;
                left += if is_leap(year) { 366 } else { 365 };
            } else if left >= len {
                left -= len;
                year += 1;
            } else {
                break;
            }
        }
        let day_of_year = left as u32 + 1;
        let feb = if is_leap(year) { 29 } else { 28 };
        let lengths = [31, feb, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];
        let mut month = 0usize;
        let mut day_in_month = left as u32;
        while day_in_month >= lengths[month] {
            day_in_month -= lengths[month];
            month += 1;
        }
        Self {
            year,
            month: month as u32 + 1,
            day: day_in_month + 1,
            // 1970-01-01 was a Thursday (3 when Monday is 0).
            weekday: (days + 3).rem_euclid(7) as u32,
            day_of_year,
            hour: (rem / 3600) as u32,
            minute: (rem / 60 % 60) as u32,
            second: (rem % 60) as u32,
        }
    }

    /// Formats with `%Y %y %m %d %e %j %B %b %h %A %a %H %I %M %S %p %F %T %%`; any other
    /// directive is written unchanged.
    pub fn format(&self, fmt: &str) -> String {
        let month_name = MONTHS[self.month as usize - 1];
        let weekday_name = WEEKDAYS[self.weekday as usize];
        let hour12 = match self.hour % 12 {
            0 => 12,
            h => h,
        };
        let mut out = String::new();
        let mut chars = fmt.chars();
        while let Some(c) = chars.next() {
            if c != '%' {
                out.push(c);
                continue;
            }
            let Some(d) = chars.next() else {
                out.push('%');
                break;
            };
            let piece = match d {
                'Y' => self.year.to_string(),
                'y' => format!("{:02}", self.year.rem_euclid(100)),
                'm' => format!("{:02}", self.month),
                'd' => format!("{:02}", self.day),
                'e' => format!("{:>2}", self.day),
                'j' => format!("{:03}", self.day_of_year),
                'B' => month_name.to_owned(),
                'b' | 'h' => month_name[..3].to_owned(),
                'A' => weekday_name.to_owned(),
                'a' => weekday_name[..3].to_owned(),
                'H' => format!("{:02}", self.hour),
                'I' => format!("{hour12:02}"),
                'M' => format!("{:02}", self.minute),
                'S' => format!("{:02}", self.second),
                'p' => if self.hour < 12 { "AM" } else { "PM" }.to_owned(),
                'F' => format!("{}-{:02}-{:02}", self.year, self.month, self.day),
                'T' => format!("{:02}:{:02}:{:02}", self.hour, self.minute, self.second),
                '%' => "%".to_owned(),
                other => format!("%{other}"),
            };
            out.push_str(&piece);
        }
        out
    }
}

/// The current UTC time formatted with `fmt`.
pub fn strftime_now(fmt: &str) -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX / 2));
    CivilTime::from_unix(secs).format(fmt)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Expected values from Python's `time.strftime(fmt, time.gmtime(secs))`.
    #[test]
    fn known_instants() {
        let t = CivilTime::from_unix(0);
        assert_eq!(
            t.format("%Y-%m-%d %H:%M:%S %A %j"),
            "1970-01-01 00:00:00 Thursday 001"
        );
        // 2024-02-29T13:05:09Z, a leap day.
        let t = CivilTime::from_unix(1_709_211_909);
        assert_eq!(
            t.format("%d %b %Y, %I:%M %p (%a) %j %%"),
            "29 Feb 2024, 01:05 PM (Thu) 060 %"
        );
        // 1969-12-31T23:59:59Z
        let t = CivilTime::from_unix(-1);
        assert_eq!(
            t.format("%F %T %B %e %y %Q"),
            "1969-12-31 23:59:59 December 31 69 %Q"
        );
    }
}
